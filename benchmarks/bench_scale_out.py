"""Snapshot-mode backfill on a standalone Spark cluster with every table on an S3 server.

    make bench-scale-out                              # 100M rows (long: the lead schedules it)
    make bench-scale-out BENCH_SCALE_OUT_ROWS=1000000
    .venv/bin/python -m benchmarks.bench_scale_out --rows 1000000

The driver (this process) starts, on loopback, moto's S3 server and a Spark standalone master +
one worker (tests/infra, the servers the scale-out tests use), prepares the upstream once
(cached under BENCH_DATA, the same rows as bench-bulk) and uploads it to the store (not timed).
Then, each in a FRESH process under `flock $BENCH_LOCK`, with BACKFILL_SPARK_MASTER=spark://...
(the worker process is the Spark driver; executors run in the cluster worker's JVMs and write
to the store themselves):
  * the bench-bulk baselines, on the same rows, through the only I/O path a store without
    Hadoop's s3a jars has (the storage layer's reader and its executor-side parquet writer):
    (a) Spark copy: read the version, write it as parquet to the store; (b) pyarrow copy: a
    pyarrow dataset over the version's objects written back to the store; (c) full refresh:
    (a) plus the MV's projection and filter;
  * snapshot mode, unthrottled (--dml-kind inserts: the DML appends new keys instead of the
    writer's merge, whose delta-rs process outgrew the machine at 100M on moto): the bulk
    barrier (all slices at the pinned version) on the
    uploaded upstream (the baselines ran before and only read it), then --catch-up-batches
    DML batches (each --dml-fraction x rows changes) committed to it, then the catch-up
    barrier that coalesces them. Backfill time = the two barriers' wall times (the DML's is
    reported apart).
moto keeps every object in memory: a 100M-row run holds the upstream (~3.7 GB) and the MV on
the store at once (~8 GB of RAM for the server). Results:
benchmarks/results/<--name, default scale_out_<rows>>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import uuid

from benchmarks import common as C

OPTIONS_ENV = "BENCH_S3_OPTIONS"  # the store's options, JSON, for the workers


def _opts() -> dict[str, str]:
    return json.loads(os.environ[OPTIONS_ENV])


def _fs(uri: str):
    from backfill_assets.storage.store import objects

    return objects.filesystem(uri, _opts())


def _drop(uri: str) -> None:
    """Delete everything under ``uri`` (a baseline's output: moto keeps it in memory)."""
    fs, path = _fs(uri)
    fs.delete_dir(path)


def _write(df, out: str) -> None:
    """The storage layer's executor-side parquet writer (no commit): what a backfill uses."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from backfill_assets.storage.rows.write import write_files

    write_files(df, out, _opts(), to_arrow_schema(df.schema, timezone="UTC"))


def _read(spark, uri: str, version: int | None):
    from backfill_assets import storage

    return storage.read_version(spark, uri, version, storage_options=_opts())


def _warm(spark, uri: str, version: int, out: str) -> None:
    """Class loading / JIT on two vnodes' rows, read and written, before any measurement."""
    from backfill_assets import storage

    for _ in range(2):
        _write(storage.read_version(spark, uri, version, vnodes=[0, 1], storage_options=_opts()),
               out)
        _drop(out)


# --------------------------------------------------------------------------- workers


def worker_baselines(args) -> dict:
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    from backfill_assets.engine.projection import KEEP, project
    from backfill_assets.storage import TableVersion

    spark, spark_start = C.start_spark()
    out = f"{args.root}/baseline-{uuid.uuid4().hex[:8]}"
    _warm(spark, args.uri, args.version, out)
    d = C.bench_mv(args.pk, "snapshot", args.vnodes, 1, args.uri)
    audit = C.CpuAudit()
    res: dict = {"spark_copy": [], "pyarrow_copy": [], "full_refresh": [],
                 "spark_start": spark_start}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        _write(_read(spark, args.uri, args.version), out)
        res["spark_copy"].append(time.perf_counter() - t0)
        _drop(out)
        t0 = time.perf_counter()
        fs, path = _fs(out)
        files = [f.path for f in TableVersion.load(args.uri, args.version, _opts()).files]
        table_path = _fs(args.uri)[1]
        dataset = ds.dataset([f"{table_path}/{p}" for p in files], format="parquet",
                             filesystem=fs)
        ds.write_dataset(dataset, path, format="parquet", filesystem=fs,
                         existing_data_behavior="overwrite_or_ignore",
                         max_rows_per_file=4_000_000, max_rows_per_group=1_000_000)
        res["pyarrow_copy"].append(time.perf_counter() - t0)
        _drop(out)
        t0 = time.perf_counter()
        mv = project(_read(spark, args.uri, args.version), d).where(F.col(KEEP)).drop(KEEP)
        _write(mv, out)
        res["full_refresh"].append(time.perf_counter() - t0)
        _drop(out)
        print(f"  baselines {C.human_rows(args.rows)}: spark copy {res['spark_copy'][-1]:.2f}s, "
              f"pyarrow copy {res['pyarrow_copy'][-1]:.2f}s, full refresh "
              f"{res['full_refresh'][-1]:.2f}s", flush=True)
    res.update(audit.result())
    return res


def worker_backfill(args) -> dict:
    import pyarrow as pa

    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.upstream.writer import apply_dml, insert_rows

    mem = C.Memory()
    run_root = f"{args.root}/run-{uuid.uuid4().hex[:8]}"
    uri = args.uri
    barrier_rows = math.ceil(args.rows * 1.25)
    d = C.bench_mv(args.pk, "snapshot", args.vnodes, barrier_rows, uri)
    tables = MVTables.under(run_root, d.name, uri, _opts())
    spark, spark_start = C.start_spark()
    mem.attach()
    _warm(spark, uri, args.version, f"{run_root}/warm")
    audit = C.CpuAudit()
    vnodes = list(range(args.vnodes))
    t0 = time.perf_counter()
    bulk = run_barrier(spark, d, tables, vnodes)
    bulk_s = time.perf_counter() - t0
    print(f"  bulk barrier: {bulk_s:.2f}s, {bulk.snapshot_rows:,} rows, "
          f"{bulk.extra.get('slices_planned')} slices", flush=True)
    assert bulk.finished, "the bulk barrier left vnodes unfinished"
    maker, spec = C.ChangeMaker(args.pk, next_id=args.rows), C.bench_spec(args.pk, args.vnodes)
    changes = max(10, round(args.rows * args.dml_fraction))
    t0 = time.perf_counter()
    for _ in range(args.catch_up_batches):
        if args.dml_kind == "inserts":
            rows = pa.Table.from_pylist([maker.row(maker.new_id()) for _ in range(changes)])
            insert_rows(uri, rows, spec=spec, storage_options=_opts(), check_existing=False)
        else:
            apply_dml(uri, maker.batch(changes), spec=spec, storage_options=_opts())
    dml_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    catch_up = run_barrier(spark, d, tables, vnodes)
    catch_up_s = time.perf_counter() - t0
    print(f"  catch-up barrier: {catch_up_s:.2f}s, {catch_up.forwarded_rows:,} changes "
          f"forwarded ({args.catch_up_batches} versions, DML {dml_s:.2f}s)", flush=True)
    verified = None
    if args.verify:
        from backfill_assets.verify.oracle import verify

        bad = verify(spark, d, tables).failures()
        verified = not bad
        assert not bad, f"oracle mismatch in {len(bad)} vnodes"
    peaks = mem.peaks()
    total = bulk_s + catch_up_s
    return {"rows": args.rows, "pk": args.pk, "vnodes": args.vnodes, "mode": "snapshot",
            "seconds": round(total, 3), "bulk_seconds": round(bulk_s, 3),
            "catch_up_seconds": round(catch_up_s, 3), "rows_per_second": round(args.rows / total),
            "snapshot_rows": bulk.snapshot_rows, "forwarded_rows": catch_up.forwarded_rows,
            "slices": bulk.extra.get("slices_planned"), "dml_seconds": round(dml_s, 3),
            "dml_versions": args.catch_up_batches, "dml_changes_per_version": changes,
            "dml_kind": args.dml_kind,
            "spark_start": round(spark_start, 2), "verified": verified,
            "driver_peak_mib": C.mib(peaks["driver_peak"]),
            "driver_jvm_peak_mib": C.mib(peaks["jvm_peak"]), **audit.result()}


# --------------------------------------------------------------------------- driver


def run(args) -> dict:
    import pyarrow.fs as pafs

    from backfill_assets.storage.store import objects
    from tests.infra.s3_server import start_s3_server
    from tests.infra.spark_servers import start_cluster

    name = args.name or f"scale_out_{C.human_rows(args.rows)}"
    work = tempfile.mkdtemp(prefix="bench-scale-out-")
    info = C.run_worker("benchmarks.bench_bulk", ["worker-prepare", "--rows", str(args.rows),
                                                  "--pk", args.pk, "--vnodes", str(args.vnodes)])
    s3 = start_s3_server(work)
    try:
        cluster = start_cluster(work, memory=args.worker_memory)
    except BaseException:
        s3.stop()
        raise
    out: dict = {"machine": C.machine_info(), "args": vars(args), "upstream": info,
                 "servers": {"s3": "moto (in memory)", "spark": "standalone, 1 worker, "
                             f"{args.worker_memory}, executor {args.executor_memory}"}}
    try:
        root = f"{s3.bucket_uri}/bench"
        uri = f"{root}/upstream"
        t0 = time.monotonic()
        fs, path = objects.filesystem(uri, s3.storage_options)
        pafs.copy_files(info["path"], path, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs, use_threads=True)
        out["upload_seconds"] = round(time.monotonic() - t0, 1)
        print(f"== {C.human_rows(args.rows)} rows uploaded to {uri} in "
              f"{out['upload_seconds']}s; cluster {cluster.master_url}", flush=True)
        os.environ.update({OPTIONS_ENV: json.dumps(s3.storage_options),
                           "BACKFILL_SPARK_MASTER": cluster.master_url,
                           "BACKFILL_SPARK_CONF": json.dumps({
                               "spark.executor.memory": args.executor_memory,
                               "spark.driver.memory": args.driver_memory})})
        common = ["--rows", str(args.rows), "--pk", args.pk, "--vnodes", str(args.vnodes),
                  "--root", root, "--uri", uri, "--version", str(info["version"])]
        # run_worker, not run_clean: the executors' CPU is outside the worker's process tree, so
        # the "foreign CPU" audit counts it (reported, never a reason to measure again)
        out["baselines"] = C.run_worker("benchmarks.bench_scale_out",
                                       ["worker-baselines", *common, "--repeat",
                                        str(args.repeat)])
        extra = ["--dml-fraction", str(args.dml_fraction), "--dml-kind", args.dml_kind,
                 "--catch-up-batches", str(args.catch_up_batches)]
        out["run"] = C.run_worker("benchmarks.bench_scale_out",
                                 ["worker-backfill", *common, *extra,
                                  *(["--verify"] if args.verify else [])])
    finally:
        cluster.stop()
        s3.stop()
    path = C.save_results(name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def print_report(out: dict) -> None:
    b, r = out["baselines"], out["run"]
    best = {k: min(b[k]) for k in ("spark_copy", "pyarrow_copy", "full_refresh")}
    print("\nBaselines on the cluster + object store (best of repeats, seconds)")
    C.print_table(["rows", "spark copy s", "pyarrow copy s", "full refresh s"],
                  [[C.human_rows(r["rows"]), best["spark_copy"], best["pyarrow_copy"],
                    best["full_refresh"]]])
    print("\nSnapshot-mode backfill (bulk barrier + catch-up barrier)")
    C.print_table(["rows", "vnodes", "bulk s", "catch-up s", "seconds", "rows/s",
                   "vs spark copy", "vs pyarrow copy", "vs full refresh", "driver peak MiB",
                   "CPU outside the driver (executors + rest)"],
                  [[C.human_rows(r["rows"]), r["vnodes"], r["bulk_seconds"],
                    r["catch_up_seconds"], r["seconds"], r["rows_per_second"],
                    *[f"{r['seconds'] / best[k]:.2f}x" for k in best],
                    r["driver_peak_mib"], f"{100 * r.get('foreign_cpu_share', 0):.0f}%"]])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--name", default=None, help="results file benchmarks/results/<name>.json")
    p.add_argument("--worker-memory", default="8g", help="the cluster worker's memory")
    p.add_argument("--executor-memory", default="6g")
    p.add_argument("--driver-memory", default="2g")
    for parser in (p, *(sub.add_parser(n) for n in ("worker-baselines", "worker-backfill"))):
        parser.add_argument("--pk", default="single", choices=C.PK_SHAPES)
        parser.add_argument("--vnodes", type=int, default=256)
        parser.add_argument("--repeat", type=int, default=1, help="repeats of each baseline")
        parser.add_argument("--dml-fraction", type=float, default=0.0001)
        parser.add_argument("--catch-up-batches", type=int, default=20,
                            help="DML versions the catch-up barrier coalesces (bench-bulk's "
                                 "cap for large runs)")
        parser.add_argument("--dml-kind", default="mixed", choices=("mixed", "inserts"),
                            help="mixed: the platform writer's merge (inserts, updates, deletes, "
                                 "pk changes); inserts: appends of new keys (at 100M the "
                                 "writer's delta-rs merge on the in-memory store outgrew 24 GB)")
        parser.add_argument("--verify", action="store_true", help="run the oracle at the end")
        if parser is not p:
            parser.add_argument("--rows", type=int, required=True)
            parser.add_argument("--root", required=True)
            parser.add_argument("--uri", required=True)
            parser.add_argument("--version", type=int, required=True)
    args = p.parse_args(argv)
    C.dispatch(args, {"worker-baselines": worker_baselines, "worker-backfill": worker_backfill},
               run)


if __name__ == "__main__":
    sys.exit(main())
