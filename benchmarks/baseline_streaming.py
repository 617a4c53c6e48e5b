"""Baseline (b) of issue 38: the Structured Streaming pattern maintaining the same MV
(the upstream's change feed, `foreachBatch` that nets per key and MERGEs into the MV with
deletion vectors on; benchmarks/delta_spark.py says exactly what it runs).

    make bench-baselines-streaming
    .venv/bin/python -m benchmarks.baseline_streaming --cost --rows 5000000
    .venv/bin/python -m benchmarks.baseline_streaming --latency --latency-rows 1000000

Cost (--cost), in a fresh process under `flock $BENCH_LOCK`: a private copy of the cached
N-row upstream bench_incremental uses (benchmarks.common.prepare_upstream; single pk `id`, 256
vnodes), the MV made by the delta-spark full refresh at its version (then
`delta.enableDeletionVectors`), the writer process of bench_incremental (DmlFeeder, seed 7,
the same sequence of batch sizes, so the same change sets: --repeat commits of each
--fractions x N changes). After each commit, one micro-batch: a
`trigger(availableNow=True)` query on the MV's checkpoint, started and awaited. Per commit:
the foreachBatch wall time (read the commit's change files, net, MERGE: "the MERGE"), the
micro-batch's durationMs (Spark's own phases), the query's wall time from start() to its end
(start-up, offsets, the batch, checkpoint commits) and the MERGE's operationMetrics from the
MV's history. Then an idle query (nothing new), the delta-spark full refresh of the final
version (--repeat), and, at 1M rows or below or with --check, the MV compared with that
refresh (both directions of exceptAll).

Latency (--latency), in one fresh process: the upstream of bench_latency (the load
generator's table of --latency-rows rows, seed 3, 256 vnodes) and jobs/configs/mv.yaml's MV;
for each --triggers (processingTime seconds; 0 = as fast as possible, one micro-batch per
commit when a batch is shorter than the interval) and each --intervals: the full refresh, a
long-running query, and a writer process committing one DML batch of --changes changes every
interval (bench_latency's generator): one commit before the query starts (its starting
version must exist) and --warm-commits, unmeasured, then --commits measured.
Commit-to-MV per commit: from the upstream's commitInfo timestamp to the end of the first
micro-batch that covers it (the end of its MERGE: the MV's new version is committed), the
covered versions read from the batch's offset in the checkpoint.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time

from benchmarks import common as C
from benchmarks import delta_spark as DS
from benchmarks.baseline_runs import load_note
from benchmarks.baseline_runs import prepare as prepare_upstream
from benchmarks.baseline_runs import run as run_worker

PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "addBatch",
          "walCommit", "commitOffsets")


def _session():
    spark, _ = C.start_spark()
    return DS.user_session(spark)  # MV with deletion vectors on; Spark's broadcast default


def _merge_metrics(spark, mv: str) -> list[dict]:
    """operationMetrics of every MERGE into the MV, oldest first."""
    from delta.tables import DeltaTable

    rows = (DeltaTable.forPath(spark, mv).history().where("operation = 'MERGE'")
            .orderBy("version").select("version", "operationMetrics").collect())
    keep = ("executionTimeMs", "scanTimeMs", "rewriteTimeMs", "numTargetRowsUpdated",
            "numTargetRowsInserted", "numTargetRowsDeleted", "numTargetDeletionVectorsAdded",
            "numTargetFilesAdded", "numTargetFilesRemoved", "numSourceRows")
    return [{"mv_version": r["version"], **{k: r["operationMetrics"].get(k) for k in keep}}
            for r in rows]


def worker_cost(args) -> dict:
    from deltalake import DeltaTable

    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"stream_{os.getpid()}")
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
    mv, ckpt = os.path.join(run_dir, "mv"), os.path.join(run_dir, "checkpoint")
    d = C.bench_mv(args.pk, "snapshot", args.vnodes, 1, uri)
    spark = _session()
    C.warm_read(spark, uri)
    DS.warm_delta(spark, uri, os.path.join(run_dir, "warm"))
    feeder = C.DmlFeeder(uri, args.pk, args.vnodes, next_id=args.rows, seed=7)
    out: dict = {"rows": args.rows, "pk": args.pk, "vnodes": args.vnodes, "cases": [],
                 "load_before": load_note()}
    try:
        v0 = DeltaTable(uri).version()
        out["initial_refresh_seconds"] = round(DS.refresh(spark, d, uri, v0, mv), 3)
        DS.enable_deletion_vectors(spark, mv)
        audit = C.CpuAudit()
        sink = DS.ChangeFeedMerge(d, mv, ckpt)

        def one_query() -> tuple[float, list[dict]]:
            t = time.perf_counter()
            q = DS.start_stream(spark, uri, v0 + 1, ckpt, sink, {"availableNow": True})
            q.awaitTermination()
            return time.perf_counter() - t, DS.progress_phases(q)

        for fraction in args.fractions:
            changes, runs = max(1, round(args.rows * fraction)), []
            for _ in range(args.repeat):
                dml = feeder.apply(changes)
                before = len(sink.batches)
                secs, progress = one_query()
                batches = sink.batches[before:]
                if len(batches) != 1 or batches[0]["through"] != dml["version"]:
                    print(f"  warning: {len(batches)} batches for version {dml['version']}: "
                          f"{batches}", flush=True)
                merge_s = sum(b["seconds"] for b in batches)
                runs.append({"version": dml["version"], "merge_seconds": round(merge_s, 3),
                             "query_seconds": round(secs, 3), "batches": len(batches),
                             "progress": progress, "dml_seconds": round(dml["seconds"], 3)})
                print(f"  streaming {fraction * 100:g}% ({changes:,} changes): foreachBatch "
                      f"(read, net, MERGE) {merge_s:.2f}s, availableNow query {secs:.2f}s "
                      f"({load_note()})", flush=True)
            med = statistics.median(r["merge_seconds"] for r in runs)
            out["cases"].append({
                "fraction": fraction, "changes": changes, "runs": runs,
                "median_merge_seconds": round(med, 3),
                "median_query_seconds": round(statistics.median(
                    r["query_seconds"] for r in runs), 3)})
        idle, _ = one_query()
        out["idle_query_seconds"] = round(idle, 3)
        out.update(audit.result())
        metrics = _merge_metrics(spark, mv)
        flat = [r for c in out["cases"] for r in c["runs"]]
        for r, m in zip(flat, metrics, strict=False):
            r["merge_metrics"] = m
        refresh_dir = os.path.join(run_dir, "refresh")
        refresh = [DS.refresh(spark, d, uri, None, refresh_dir) for _ in range(args.repeat)]
        out["delta_spark_refresh_final"] = [round(x, 3) for x in refresh]
        out["delta_spark_refresh_final_median"] = round(statistics.median(refresh), 3)
        print(f"  delta-spark full refresh of the final version: {out['delta_spark_refresh_final']}"
              f" ({load_note()})", flush=True)
        if args.check or args.rows <= 1_000_000:
            a = spark.read.format("delta").load(mv)
            b = spark.read.format("delta").load(refresh_dir)
            extra, missing = a.exceptAll(b).count(), b.exceptAll(a).count()
            out["check"] = {"mv_rows": a.count(), "extra_rows": extra, "missing_rows": missing}
            print(f"  check against the refresh: {out['check']}", flush=True)
            if extra or missing:
                raise AssertionError(f"the streamed MV differs from the refresh: {out['check']}")
        out["load_after"] = load_note()
    finally:
        feeder.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _commits(uri: str, interval: float, commits: int, changes: int, base: int) -> list[int]:
    """bench_latency's writer: one load-generator DML batch every `interval` seconds."""
    from backfill_assets.upstream.writer import Generator, LoadParams, apply_dml

    gen, weights = Generator.reading(uri, 3), LoadParams().weights()
    spec = gen.spec
    versions, next_at = [], time.monotonic()
    for i in range(commits):
        time.sleep(max(0.0, next_at - time.monotonic()))
        versions.append(apply_dml(uri, gen.batch(base + i, changes, weights), spec=spec))
        next_at += interval
    return versions


def _writer_main(conn, uri: str, interval: float, commits: int, changes: int, base: int):
    conn.send(_commits(uri, interval, commits, changes, base))


def _mv_definition(uri: str, vnodes: int):
    import yaml

    from backfill_assets.core.mv_definition import MVDefinition

    with open(os.path.join(C.ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    return MVDefinition.from_dict({**raw, "upstream": uri, "vnode_count": vnodes})


def latency_case(spark, d, uri: str, tmp: str, trigger: float, interval: float, args,
                 base: int) -> dict:
    from deltalake import DeltaTable

    name = f"t{trigger:g}_i{interval:g}"
    mv, ckpt = os.path.join(tmp, f"mv_{name}"), os.path.join(tmp, f"ckpt_{name}")
    v0 = DeltaTable(uri).version()
    DS.refresh(spark, d, uri, v0, mv)
    DS.enable_deletion_vectors(spark, mv)
    sink = DS.ChangeFeedMerge(d, mv, ckpt)
    # the stream's starting version must exist: one commit first, its batch not measured
    first = _commits(uri, 0, 1, args.changes, base - 1)[0]
    q = DS.start_stream(spark, uri, v0 + 1, ckpt, sink,
                        {"processingTime": f"{trigger:g} seconds"})
    end = time.monotonic() + args.drain
    while time.monotonic() < end and not (sink.batches and sink.batches[-1]["through"] >= first):
        time.sleep(0.1)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    total = args.warm_commits + args.commits
    writer = ctx.Process(target=_writer_main, daemon=True,
                         args=(child, uri, interval, total, args.changes, base))
    audit = C.CpuAudit()
    writer.start()
    try:
        versions = conn.recv()
        writer.join(30)
        end = time.monotonic() + args.drain
        while time.monotonic() < end and not (
                sink.batches and (sink.batches[-1]["through"] or -1) >= versions[-1]):
            time.sleep(0.2)
        progress = DS.progress_phases(q)
    finally:
        q.stop()
    usage = audit.result()
    up_time = {int(h["version"]): h["timestamp"] / 1000.0 for h in DeltaTable(uri).history()}
    measured = versions[args.warm_commits:]
    lat, wait, missed = [], [], []
    for v in measured:
        first = next((b for b in sink.batches if (b["through"] or -1) >= v), None)
        if first is None:
            missed.append(v)
            continue
        lat.append(first["end"] - up_time[v])
        wait.append(first["start"] - up_time[v])
    batches = [b for b in sink.batches if (b["through"] or -1) >= measured[0]]
    phases = {k: C.summary([p[k] / 1000 for p in progress if p.get(k) is not None
                            and p["batch_id"] >= batches[0]["batch_id"]])
              for k in PHASES} if batches else {}
    res = {"trigger_seconds": trigger, "interval": interval, "commits": len(measured),
           "missed": missed, "batches": len(batches), "latency": C.summary(lat),
           "latencies": [round(x, 3) for x in lat],
           "breakdown": {"commit -> foreachBatch start (trigger wait, offsets, planning)":
                         C.summary(wait),
                         "foreachBatch (read changes, net, MERGE)":
                         C.summary([b["seconds"] for b in batches])},
           "progress_seconds": phases, **usage, "load": load_note()}
    print_latency(res)
    return res


def worker_latency(args) -> dict:
    from backfill_assets.upstream.writer import LoadParams, run_load

    tmp = os.path.join(C.WORK_DIR, f"stream_latency_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    uri = os.path.join(tmp, "upstream")
    run_load(uri, LoadParams(seed=3, initial_rows=args.latency_rows, versions=0),
             vnode_count=args.vnodes)
    d = _mv_definition(uri, args.vnodes)
    spark = _session()
    out: dict = {"rows": args.latency_rows, "vnodes": args.vnodes, "changes": args.changes,
                 "results": []}
    try:
        C.warm_read(spark, uri)
        DS.warm_delta(spark, uri, os.path.join(tmp, "warm"))
        for i, (trigger, interval) in enumerate(
                [(t, iv) for iv in args.intervals for t in args.triggers]):
            out["results"].append(latency_case(spark, d, uri, tmp, trigger, interval, args,
                                               base=10_001 + 1_000 * i))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def print_latency(r: dict) -> None:
    lat = r["latency"]
    print(f"\nstreaming pattern, processingTime {r['trigger_seconds']:g} s, one commit per "
          f"{r['interval']:g} s: {r['commits']} commits, {r['batches']} micro-batches, "
          f"{len(r['missed'])} never reached the MV; "
          f"{100 * r.get('foreign_cpu_share', 0):.0f}% foreign CPU; {r['load']}", flush=True)
    if lat.get("n"):
        C.print_table(["n", "median s", "p95 s", "min s", "max s"],
                      [[lat["n"], lat["median"], lat["p95"], lat["min"], lat["max"]]])
    C.print_table(["phase (seconds)", "n", "median", "p95"],
                  [[k, v["n"], v.get("median", "-"), v.get("p95", "-")]
                   for k, v in {**r["breakdown"], **{f"durationMs {k}": v for k, v in
                                                     r["progress_seconds"].items()}}.items()])


def run(args) -> dict:
    out: dict = {"machine": C.machine_info(), "args": vars(args)}
    common = ["--pk", args.pk, "--vnodes", str(args.vnodes)]
    if args.cost:
        prepare_upstream(args.rows, args.pk, args.vnodes)
        out["cost"] = run_worker("benchmarks.baseline_streaming", [
            "worker-cost", "--rows", str(args.rows), *common, "--repeat", str(args.repeat),
            "--fractions", *map(str, args.fractions), *(["--check"] if args.check else [])])
        C.save_results(args.name, out)
    if args.latency:
        out["latency"] = run_worker("benchmarks.baseline_streaming", [
            "worker-latency", "--latency-rows", str(args.latency_rows), *common,
            "--intervals", *map(str, args.intervals), "--triggers", *map(str, args.triggers),
            "--commits", str(args.commits), "--warm-commits", str(args.warm_commits),
            "--changes", str(args.changes), "--drain", str(args.drain)])
    path = C.save_results(args.name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def print_report(out: dict) -> None:
    cost = out.get("cost")
    if cost:
        print(f"\nStructured Streaming MERGE pattern, {C.human_rows(cost['rows'])} rows "
              f"(median seconds; full refresh {cost['delta_spark_refresh_final_median']} s)")
        C.print_table(["changed", "changes", "foreachBatch (MERGE) s", "availableNow query s"],
                      [[f"{c['fraction'] * 100:g}%", c["changes"], c["median_merge_seconds"],
                        c["median_query_seconds"]] for c in cost["cases"]])
    for r in (out.get("latency") or {}).get("results", []):
        print_latency(r)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    parsers = (p, sub.add_parser("worker-cost"), sub.add_parser("worker-latency"))
    for parser in parsers:
        parser.add_argument("--rows", type=int, default=5_000_000)
        parser.add_argument("--latency-rows", type=int, default=1_000_000)
        parser.add_argument("--pk", default="single", choices=C.PK_SHAPES)
        parser.add_argument("--vnodes", type=int, default=256)
        parser.add_argument("--fractions", type=float, nargs="+", default=[0.0001, 0.001, 0.01])
        parser.add_argument("--repeat", type=int, default=3)
        parser.add_argument("--check", action="store_true")
        parser.add_argument("--intervals", type=float, nargs="+", default=[1.0, 5.0])
        parser.add_argument("--triggers", type=float, nargs="+", default=[0.0, 1.0],
                            help="processingTime seconds of the latency runs (0: no wait)")
        parser.add_argument("--commits", type=int, default=40)
        parser.add_argument("--warm-commits", type=int, default=5)
        parser.add_argument("--changes", type=int, default=20)
        parser.add_argument("--drain", type=float, default=60)
    p.add_argument("--cost", action="store_true", help="cost of a change set")
    p.add_argument("--latency", action="store_true", help="commit-to-MV latency")
    p.add_argument("--name", default="baseline_streaming")
    args = p.parse_args(argv)
    if args.cmd is None and not (args.cost or args.latency):
        args.cost = args.latency = True
    C.dispatch(args, {"worker-cost": worker_cost, "worker-latency": worker_latency}, run)


if __name__ == "__main__":
    sys.exit(main())
