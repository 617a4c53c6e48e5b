"""Baselines (a) and (c) of issue 38: the delta-spark full refresh of the MV, and the
machine's floors (a pyarrow copy and a plain JVM Spark copy of the upstream's files).

    make bench-baselines-refresh                      # 5M rows (BENCH_BASELINE_ROWS)
    flock /tmp/spark.lock .venv/bin/python -m benchmarks.baseline_delta_spark --rows 5000000
    .venv/bin/python -m benchmarks.baseline_delta_spark --rows 20000000 100000000

For each size, on the benchmarks' cached upstream of N rows (benchmarks.common.prepare_upstream:
8 columns, ids 0..N-1, 256 vnodes, single pk `id` unless --pk; the same table bench_bulk
backfills), in ONE fresh process under `flock $BENCH_LOCK` (a Spark session of the platform,
resources.spark.get_spark, which loads Delta's jars, SQL extension and catalog, with Spark's
default broadcast threshold and deletion vectors on: delta_spark.user_session), warmed up
(the project's parquet read/write and Delta's read, write and MERGE on a few vnodes), then
--repeat times each:
  * delta-spark full refresh (benchmarks.delta_spark.refresh): `spark.read.format("delta")
    .option("versionAsOf", v).load(upstream).where("qty > 0 AND NOT flag").selectExpr(id,
    region, name, amount, qty, ts, amount * qty AS total, upper(name) AS name_upper)
    .write.format("delta").mode("overwrite").save(mv)` (the MV of bench_mv / mv.yaml);
  * pyarrow copy (benchmarks.baselines.pyarrow_copy): a pyarrow dataset scan of the version's
    files written back as parquet, streamed and multi-threaded;
  * plain JVM Spark copy (benchmarks.baselines.jvm_spark_copy):
    `spark.read.parquet(*files).write.parquet(out)` of the same files.
The version is the upstream's bulk version (no DML yet), the one snapshot mode's bulk barrier
reads. Each figure is wall seconds of that call (Spark start excluded); the median is the
baseline. Results: benchmarks/results/<--name>.json, with the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

from benchmarks import baselines as B
from benchmarks import common as C
from benchmarks import delta_spark as DS
from benchmarks.baseline_runs import load_note
from benchmarks.baseline_runs import prepare as prepare_upstream
from benchmarks.baseline_runs import run as run_worker

KINDS = ("delta_spark_refresh", "pyarrow_copy", "jvm_spark_copy")


def worker(args) -> dict:
    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    uri, version = info["path"], info["version"]
    out = os.path.join(C.WORK_DIR, f"delta_spark_{os.getpid()}")
    spark, spark_start = C.start_spark()
    DS.user_session(spark)
    res: dict = {"rows": args.rows, "pk": args.pk, "vnodes": args.vnodes, "version": version,
                 "spark_start": round(spark_start, 2), "load_before": load_note(),
                 **{k: [] for k in KINDS}}
    try:
        C.warm_read(spark, uri)
        DS.warm_delta(spark, uri, out + "_warm")
        audit = C.CpuAudit()
        d = C.bench_mv(args.pk, "snapshot", args.vnodes, 1, uri)
        for _ in range(args.repeat):
            res["delta_spark_refresh"].append(DS.refresh(spark, d, uri, version, out + "_mv"))
            if not args.no_floors:
                res["pyarrow_copy"].append(B.pyarrow_copy(uri, version, out + "_arrow"))
                res["jvm_spark_copy"].append(B.jvm_spark_copy(spark, uri, version, out + "_jvm"))
            print(f"  {C.human_rows(args.rows)} {args.pk}: " + ", ".join(
                f"{k} {res[k][-1]:.2f}s" for k in KINDS if res[k]) + f" ({load_note()})",
                flush=True)
        res["mv_rows"] = spark.read.format("delta").load(out + "_mv").count()
        res.update(audit.result())
    finally:
        for suffix in ("_warm", "_mv", "_arrow", "_jvm"):
            shutil.rmtree(out + suffix, ignore_errors=True)
    for k in KINDS:
        res[k] = [round(x, 3) for x in res[k]]
        if res[k]:
            res[f"{k}_median"] = round(statistics.median(res[k]), 3)
    res["load_after"] = load_note()
    res["upstream"] = info
    return res


def measure(rows: int, pk: str, vnodes: int, repeat: int, floors: bool = True) -> dict:
    """Prepare the upstream and run the worker in a fresh process under the lock (once more
    if other processes took more than 10% of the CPU meanwhile; benchmarks.baseline_runs)."""
    common = ["--rows", str(rows), "--pk", pk, "--vnodes", str(vnodes)]
    prepare_upstream(rows, pk, vnodes)
    extra = ["--repeat", str(repeat)] + ([] if floors else ["--no-floors"])
    return run_worker("benchmarks.baseline_delta_spark", ["worker", *common, *extra])


def run(args) -> dict:
    out: dict = {"machine": C.machine_info(), "args": vars(args), "results": []}
    for rows in args.rows:
        print(f"== {C.human_rows(rows)} rows, {args.pk} pk, {args.vnodes} vnodes", flush=True)
        out["results"].append(measure(rows, args.pk, args.vnodes, args.repeat,
                                      not args.no_floors))
        path = C.save_results(args.name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def print_report(out: dict) -> None:
    print("\ndelta-spark full refresh and the machine's floors (median seconds)")
    C.print_table(["rows", "pk", *KINDS, "foreign cpu", "load"],
                  [[C.human_rows(r["rows"]), r["pk"],
                    *[r.get(f"{k}_median", "-") for k in KINDS],
                    f"{100 * r.get('foreign_cpu_share', 0):.0f}%",
                    r.get("load_after", "")] for r in out["results"]])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000])
    p.add_argument("--name", default="baseline_delta_spark")
    for parser in (p, sub.add_parser("worker")):
        parser.add_argument("--pk", default="single", choices=C.PK_SHAPES)
        parser.add_argument("--vnodes", type=int, default=256)
        parser.add_argument("--repeat", type=int, default=3)
        parser.add_argument("--no-floors", action="store_true",
                            help="the delta-spark refresh only (no pyarrow / JVM copies)")
    sub.choices["worker"].add_argument("--rows", type=int, required=True)
    args = p.parse_args(argv)
    C.dispatch(args, {"worker": worker}, run)


if __name__ == "__main__":
    sys.exit(main())
