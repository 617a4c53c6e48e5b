"""Bulk backfill throughput, per-phase profile and peak memory, against three baselines.

    make bench-bulk BENCH_ROWS="1000000 5000000 20000000"
    .venv/bin/python -m benchmarks.bench_bulk --rows 100000 --pk single composite

For each size and pk shape: an upstream of N rows x 8 columns (cached under BENCH_DATA), then,
each in a FRESH process under `flock $BENCH_LOCK`:
  * baselines on the same rows: (a) Spark read.parquet -> write.parquet copy, (b) pyarrow
    dataset copy, (c) naive full refresh (Spark: read, mv_spark.project + filter, overwrite),
    (d) the same refresh with each task's rows in (vnode, key) order, the MV's layout (the
    floor of any backfill that writes it; benchmarks/baselines.py);
  * per mode (arrangement, no_shuffle): an unthrottled backfill to completion with
    `run_barrier` in-process, while a separate writer process commits a DML batch
    (--dml-fraction of the rows: inserts, updates, deletes, pk changes) before every barrier;
  * snapshot mode: the bulk barrier (all slices at one pinned version), then the writer commits
    as many batches as the chunked modes' barriers would have seen meanwhile
    (rows / --barrier-rows), then the catch-up barrier that coalesces them; both count.
Backfill time = the sum of the barriers' wall times (replica initialisation included; the
writer's DML time and the Spark session start are not). Peak RSS: VmHWM of the driver (from
the end of the warm-up on, before the check of the result) and of its Spark JVM, and the phase
the driver's peak fell in (``memory_trace``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time

from benchmarks import baselines as B
from benchmarks import common as C
from benchmarks.bulk_report import print_report
from benchmarks.memory_trace import RssTrace, reset_peak

MODES = ("snapshot", "arrangement", "no_shuffle")


# --------------------------------------------------------------------------- workers


def worker_prepare(args) -> dict:
    return C.prepare_upstream(args.rows, args.pk, args.vnodes)


def worker_baselines(args) -> dict:
    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    uri, version = info["path"], info["version"]
    out = os.path.join(C.WORK_DIR, f"baseline_{os.getpid()}")
    spark, spark_start = C.start_spark()
    C.warm_read(spark, uri)
    audit = C.CpuAudit()
    d = C.bench_mv(args.pk, "arrangement", args.vnodes, 1, uri)
    res: dict = {"spark_copy": [], "pyarrow_copy": [], "full_refresh": [],
                 "clustered_refresh": [], "spark_start": spark_start}
    try:
        for _ in range(args.repeat):
            res["spark_copy"].append(B.spark_copy(spark, uri, version, out + "_spark"))
            res["pyarrow_copy"].append(B.pyarrow_copy(uri, version, out + "_arrow"))
            res["full_refresh"].append(B.full_refresh(spark, d, uri, version, out + "_mv"))
            res["clustered_refresh"].append(
                B.clustered_refresh(spark, d, uri, version, out + "_mv"))
            print(f"  baselines {C.human_rows(args.rows)} {args.pk}: spark copy "
                  f"{res['spark_copy'][-1]:.2f}s, pyarrow copy {res['pyarrow_copy'][-1]:.2f}s, "
                  f"full refresh {res['full_refresh'][-1]:.2f}s, clustered refresh "
                  f"{res['clustered_refresh'][-1]:.2f}s", flush=True)
    finally:
        for suffix in ("_spark", "_arrow", "_mv"):
            shutil.rmtree(out + suffix, ignore_errors=True)
    res["upstream"] = info
    res.update(audit.result())
    return res


def _file_count(uri: str) -> int | None:
    from deltalake import DeltaTable

    try:
        return len(DeltaTable(uri).file_uris())
    except Exception:  # noqa: BLE001 - the table may not exist (no_shuffle has no replica)
        return None


def chunk_for(mode: str, barrier_rows: int, vnode_count: int) -> int:
    """The MV chunk size giving ~barrier_rows snapshot rows per barrier in either mode
    (arrangement's chunk is per vnode, no_shuffle's is in total)."""
    if mode == "arrangement":
        return max(1, math.ceil(barrier_rows / vnode_count))
    return max(1, barrier_rows)


def worker_backfill(args) -> dict:
    """One unthrottled backfill to completion under a steady change stream."""
    import pyarrow as pa

    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.core.read_cost import ReadCost
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.step.modes import mode_named

    mem = C.Memory()
    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"bulk_{os.getpid()}")
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
    barrier_rows = args.barrier_rows or math.ceil(args.rows * 1.25)  # 0: one barrier
    chunk = chunk_for(args.mode, barrier_rows, args.vnodes)
    d = C.bench_mv(args.pk, args.mode, args.vnodes, chunk, uri)
    tables = MVTables.under(run_dir, d.name, uri)
    changes = max(10, round(args.rows * args.dml_fraction))
    feeder = C.DmlFeeder(uri, args.pk, args.vnodes, next_id=args.rows)
    prof = C.PhaseProfiler().install()
    trace = RssTrace(prof).start()
    spark, spark_start = C.start_spark()
    mem.attach()
    prof.jvm = mem.jvm
    C.warm_read(spark, uri)
    mem.snapshot("spark started")
    reset_peak()  # the driver's peak is the backfill's (what it holds after the warm-up counts)
    audit = C.CpuAudit()
    vnodes = list(range(args.vnodes))
    barriers: list[dict] = []
    stated: list[int] = []  # the barrier whose read the upstream's layout bound, once said
    phases: dict = {}
    total = 0.0
    partial = False

    def barrier(n: int, dml: dict):
        nonlocal total
        prof.reset()
        t0 = time.perf_counter()
        report = run_barrier(spark, d, tables, vnodes)
        took = time.perf_counter() - t0
        total += took
        ph = prof.reset()
        C.add_phases(phases, ph)
        s = mem.snapshot(f"barrier {n}")
        barriers.append({
            "files": {"replica": _file_count(tables.replica), "mv": _file_count(tables.mv)},
            "seconds": round(took, 3), "v_new": report.v_new,
            "snapshot_rows": report.snapshot_rows, "forwarded_rows": report.forwarded_rows,
            "replicated_rows": report.replicated_rows, "dml_seconds": round(dml["seconds"], 3),
            "driver_rss_mib": C.mib(s["driver_rss"]), "jvm_rss_mib": C.mib(s["jvm_rss"]),
            "arrow_allocated_mib": C.mib(pa.total_allocated_bytes()),
            "arrow_pool": pa.default_memory_pool().backend_name,
            "phases": C.rounded_phases(ph),
            "extra": {k: v for k, v in report.extra.items() if k != "slices"},
        })
        scanned = report.extra.get("snapshot_rows_scanned")
        if scanned is not None and not stated:  # what the barrier's Dagster run would warn
            done = sum(b["snapshot_rows"] for b in barriers)
            cost = ReadCost(mode_named(args.mode).seeks_upstream, report.snapshot_rows, scanned,
                            max(0, args.rows - done), chunk, args.rows)
            if cost.layout_bound:
                stated.append(n)
                print(f"  barrier {n} bound by the layout: {cost.statement()}", flush=True)
        print(f"  {args.mode} {C.human_rows(args.rows)} {args.pk} barrier {n}: {took:.2f}s "
              f"snapshot {report.snapshot_rows:,} "
              f"{'' if scanned is None else f'(files read {scanned:,} rows) '}"
              f"fwd {report.forwarded_rows:,} "
              f"repl {report.replicated_rows:,} (dml {dml['seconds']:.2f}s, "
              f"{changes} changes) driver {C.mib(s['driver_rss'])} MiB "
              f"jvm {C.mib(s['jvm_rss'])} MiB", flush=True)
        return report

    try:
        for n in range(args.max_barriers):
            report = barrier(n, feeder.apply(changes))
            if report.finished:
                if args.mode == "snapshot":  # the writer's changes meanwhile, then catch-up
                    for _ in range(catch_up_batches(args, barrier_rows) - 1):
                        feeder.apply(changes)
                    barrier(n + 1, feeder.apply(changes))
                break
            if args.budget and total >= args.budget:
                partial = True  # bounded run: stop here and project the rest
                print(f"  budget of {args.budget:.0f}s spent: stopping (partial run)", flush=True)
                break
        else:
            raise RuntimeError(f"not finished after {args.max_barriers} barriers")
        peaks = mem.peaks()  # before the check below, which holds every row in Python at 1M
        memory = trace.stop()
        print(f"  driver peak {memory['peak_mib']} MiB in {memory['peak_at'].get('phases')}; "
              f"by phase: {list(memory['by_phase_mib'].items())[:6]}; at: "
              f"{memory['peak_at'].get('stack', [])[-4:]}", flush=True)
        verified = None
        if not partial and (args.verify or (args.verify is None and args.rows <= 200_000)):
            if args.rows <= 2_000_000:
                from backfill_assets.verify.oracle import verify

                bad = verify(spark, d, tables).failures()
            else:  # the oracle holds every row in Python: per-vnode fingerprints instead
                from benchmarks.scale_check import scale_check

                check = scale_check(spark, d, tables)
                print(f"  scale check: {check}", flush=True)
                bad = check["mismatched"] + check["types"] if not check["ok"] else []
            verified = not bad
            if bad:
                raise AssertionError(f"MV differs from the recompute: {bad[:5]}")
        from backfill_assets.upstream.writer import row_count

        result = {
            "rows": args.rows, "pk": args.pk, "mode": args.mode, "vnodes": args.vnodes,
            "chunk_size": chunk, "barrier_rows": barrier_rows, "dml_changes_per_barrier": changes,
            "barriers": len(barriers), "seconds": round(total, 3),
            "rows_per_second": round(args.rows / total, 1),
            "dml_seconds": round(feeder.seconds, 3), "spark_start": round(spark_start, 2),
            "mv_rows": row_count(tables.mv), "upstream_rows_final": row_count(uri),
            "verified": verified, "phases": C.rounded_phases(phases), **audit.result(),
            "per_barrier": barriers, "partial": partial,
            "snapshot_rows_done": sum(b["snapshot_rows"] for b in barriers),
            "projected_seconds": (round(project_total(barriers, args.rows, barrier_rows), 1)
                                  if partial else None),
            "driver_peak_mib": C.mib(peaks["driver_peak"]),
            "jvm_peak_mib": C.mib(peaks["jvm_peak"]),
            "spark_python_workers": peaks["spark_python_workers"],
            "driver_memory_by_phase": memory,
            "memory_samples": [{k: (C.mib(v) if k != "label" else v) for k, v in s.items()}
                               for s in mem.samples],
        }
    finally:
        feeder.close()
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    return result


def catch_up_batches(args, barrier_rows: int) -> int:
    """DML batches the snapshot's catch-up coalesces: as many as the chunked modes' barriers
    would have seen (rows / barrier rows), at most 20 so a 100M run's writer stays bounded."""
    return args.catch_up_batches or min(20, max(1, math.ceil(args.rows / barrier_rows)))


def project_total(barriers: list[dict], rows: int, barrier_rows: int) -> float:
    """A partial run's projected total. The barriers after the first (which also initialises
    the replica) cost about the same each: every barrier scans all rows of the unfinished
    vnodes (the position predicate prunes nothing), so the rest costs their mean each."""
    done = sum(b["snapshot_rows"] for b in barriers)
    later = [b["seconds"] for b in barriers[1:]] or [barriers[0]["seconds"]]
    left = max(0, rows - done)
    return sum(b["seconds"] for b in barriers) + math.ceil(left / barrier_rows) * (
        sum(later) / len(later))


# --------------------------------------------------------------------------- driver


def run(args) -> dict:
    out: dict = {"machine": C.machine_info(), "args": vars(args), "baselines": [], "runs": []}
    prev = C.Previous(args.name, args.fresh)
    for rows in args.rows:
        for pk in args.pk:
            common = ["--rows", str(rows), "--pk", pk, "--vnodes", str(args.vnodes)]
            print(f"== {C.human_rows(rows)} rows, {pk} pk, {args.vnodes} vnodes", flush=True)
            C.run_worker("benchmarks.bench_bulk", ["worker-prepare", *common])
            if not args.skip_baselines:
                base = prev.find("baselines", rows=rows, pk=pk) or {
                    "rows": rows, "pk": pk,
                    **C.run_clean("benchmarks.bench_bulk",
                                  ["worker-baselines", *common, "--repeat", str(args.repeat)])}
                out["baselines"].append(base)
            for mode in args.modes:
                extra = ["--dml-fraction", str(args.dml_fraction),
                         "--max-barriers", str(args.max_barriers), "--budget", str(args.budget)]
                extra += ["--barrier-rows", str(args.barrier_rows)]
                if args.verify:
                    extra.append("--verify")
                r = prev.find("runs", rows=rows, pk=pk, mode=mode, vnodes=args.vnodes,
                              barrier_rows=args.barrier_rows or math.ceil(rows * 1.25))
                if r:
                    out["runs"].append(r)
                    continue
                try:
                    r = C.run_clean("benchmarks.bench_bulk",
                                    ["worker-backfill", *common, "--mode", mode, *extra])
                except RuntimeError as exc:
                    print(f"  FAILED: {exc}", flush=True)
                    for name in os.listdir(C.WORK_DIR) if os.path.isdir(C.WORK_DIR) else []:
                        if name.startswith(("bulk_", "warm_", "baseline_")):  # dead worker's
                            shutil.rmtree(os.path.join(C.WORK_DIR, name), ignore_errors=True)
                    r = {"rows": rows, "pk": pk, "mode": mode, "vnodes": args.vnodes,
                         "failed": str(exc)}
                out["runs"].append(r)
                path = C.save_results(args.name, out)
            path = C.save_results(args.name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000, 20_000_000])
    p.add_argument("--pk", nargs="+", default=["single", "composite"], choices=C.PK_SHAPES)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--vnodes", type=int, default=256)
    p.add_argument("--barrier-rows", type=int, default=1_000_000,
                   help="snapshot rows per barrier, the same at every size so that memory is "
                        "compared like for like (0: 1.25 x rows, i.e. one barrier)")
    p.add_argument("--dml-fraction", type=float, default=0.0001,
                   help="changes committed to the upstream before each barrier, x rows")
    p.add_argument("--repeat", type=int, default=2, help="repeats of each baseline")
    p.add_argument("--max-barriers", type=int, default=400)
    p.add_argument("--budget", type=float, default=900,
                   help="seconds of barriers per backfill before it stops and projects the "
                        "rest (0: no bound)")
    p.add_argument("--verify", action="store_true",
                   help="check each finished MV: the oracle up to 2M rows, scale_check above")
    p.add_argument("--skip-baselines", action="store_true")
    p.add_argument("--fresh", action="store_true",
                   help="measure everything again (default: reuse results of an interrupted "
                        "earlier invocation on the same code)")
    p.add_argument("--name", default="bulk", help="results file benchmarks/results/<name>.json")
    for name in ("worker-prepare", "worker-baselines", "worker-backfill"):
        w = sub.add_parser(name)
        w.add_argument("--rows", type=int, required=True)
        w.add_argument("--pk", required=True, choices=C.PK_SHAPES)
        w.add_argument("--vnodes", type=int, default=256)
        w.add_argument("--mode", choices=MODES, default="arrangement")
        w.add_argument("--repeat", type=int, default=2)
        w.add_argument("--barrier-rows", type=int, default=0)
        w.add_argument("--dml-fraction", type=float, default=0.0001)
        w.add_argument("--max-barriers", type=int, default=400)
        w.add_argument("--budget", type=float, default=900,
                       help="stop a backfill after this many seconds of barriers and project "
                            "the rest (0: no bound)")
        w.add_argument("--verify", action="store_true", default=None)
        w.add_argument("--keep", action="store_true")
        w.add_argument("--catch-up-batches", type=int, default=0,
                       help="snapshot mode: DML batches before the catch-up barrier (0: auto)")
    args = p.parse_args(argv)
    C.dispatch(args, {"worker-prepare": worker_prepare, "worker-baselines": worker_baselines,
                      "worker-backfill": worker_backfill}, run)


if __name__ == "__main__":
    sys.exit(main())
