"""Incremental cost: one barrier carrying 0.01% / 0.1% / 1% changed rows on a finished MV,
against the naive full refresh of the same MV.

    make bench-incremental BENCH_INC_ROWS=5000000
    .venv/bin/python -m benchmarks.bench_incremental --rows 100000

Per mode, in a fresh process under `flock $BENCH_LOCK`: backfill an N-row upstream to
completion (one big barrier), time an idle barrier (no new upstream version: the fixed cost),
then for each fraction commit one DML batch of fraction x N changes (inserts, updates,
deletes, pk changes) from a separate writer process and time the barrier that carries it
(--repeat times; the median is reported). The full refresh (Spark: read the upstream version,
mv_spark.project + filter, overwrite parquet) runs on the final upstream version in the same
process.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import time

from benchmarks import baselines as B
from benchmarks import common as C

MODES = ("snapshot", "arrangement", "no_shuffle")


def worker(args) -> dict:
    from backfill_assets import storage
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables

    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"inc_{os.getpid()}")
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
    # the initial backfill is not what is measured: one barrier where the default 2g Spark
    # driver holds it (arrangement), 1M-row barriers for no_shuffle (its one-barrier top-K
    # chunk of 5M rows runs the JVM out of heap, see docs/BENCHMARKS.md)
    one = math.ceil(args.rows * 1.25)
    barrier_rows = args.barrier_rows or (one if args.mode != "no_shuffle"
                                         else min(one, 1_000_000))
    chunk = (math.ceil(barrier_rows / args.vnodes) if args.mode != "no_shuffle"
             else barrier_rows)
    d = C.bench_mv(args.pk, args.mode, args.vnodes, chunk, uri)
    tables = MVTables.under(run_dir, d.name, uri)
    feeder = C.DmlFeeder(uri, args.pk, args.vnodes, next_id=args.rows, seed=7)
    prof = C.PhaseProfiler().install()
    spark, _ = C.start_spark()
    prof.jvm = C.java_pid()
    C.warm_read(spark, uri)
    audit = C.CpuAudit()
    vnodes = list(range(args.vnodes))
    out: dict = {"rows": args.rows, "pk": args.pk, "mode": args.mode, "vnodes": args.vnodes,
                 "cases": []}
    try:
        t0 = time.perf_counter()
        for _ in range(args.max_barriers):
            report = run_barrier(spark, d, tables, vnodes)
            if report.finished:
                break
        else:
            raise RuntimeError("backfill did not finish")
        out["backfill_seconds"] = round(time.perf_counter() - t0, 2)
        prof.reset()
        print(f"  {args.mode}: backfill of {args.rows:,} rows done in "
              f"{out['backfill_seconds']}s", flush=True)

        profiles = os.environ.get("BENCH_CPROFILE")  # a folder: one cProfile per barrier
        n_barrier = [0]

        def timed_barrier() -> tuple[float, dict, object]:
            prof.reset()
            cpu = _cprofile_start() if profiles else None
            t = time.perf_counter()
            rep = run_barrier(spark, d, tables, vnodes)
            secs = time.perf_counter() - t
            if cpu is not None:
                n_barrier[0] += 1
                _cprofile_dump(cpu, os.path.join(profiles, f"barrier_{n_barrier[0]}.prof"))
            return secs, prof.reset(), rep

        cases = [(0.0, 0)] + [(f, max(1, round(args.rows * f))) for f in args.fractions]
        for fraction, changes in cases:
            runs = []
            for _ in range(args.repeat):
                dml = feeder.apply(changes) if changes else {"seconds": 0.0}
                secs, phases, rep = timed_barrier()
                runs.append({"seconds": round(secs, 3), "forwarded_rows": rep.forwarded_rows,
                             "dml_seconds": round(dml["seconds"], 3),
                             "phases": C.rounded_phases(phases)})
                print(f"  {args.mode} {fraction * 100:g}% ({changes:,} changes): barrier "
                      f"{secs:.2f}s, {rep.forwarded_rows:,} rows forwarded", flush=True)
            med = statistics.median(r["seconds"] for r in runs)
            mid = min(runs, key=lambda r: abs(r["seconds"] - med))
            out["cases"].append({"fraction": fraction, "changes": changes, "runs": runs,
                                 "median_seconds": round(med, 3), "median_run": mid})
        if args.consecutive:
            out["consecutive"] = consecutive(spark, d, tables, feeder, args, timed_barrier)
        latest = storage.latest_version(uri)
        refresh_dir = os.path.join(run_dir, "refresh")
        refresh = [B.full_refresh(spark, d, uri, latest, refresh_dir) for _ in range(args.repeat)]
        out["full_refresh_seconds"] = [round(x, 3) for x in refresh]
        out["full_refresh_median"] = round(statistics.median(refresh), 3)
        print(f"  {args.mode}: full refresh {out['full_refresh_seconds']}", flush=True)
        mem = C.Memory()
        mem.attach()
        out["driver_peak_mib"] = C.mib(mem.peaks()["driver_peak"])
        out.update(audit.result())
    finally:
        feeder.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _cprofile_start():
    import cProfile
    cpu = cProfile.Profile()
    cpu.enable()
    return cpu


def _cprofile_dump(cpu, path: str) -> None:
    cpu.disable()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cpu.dump_stats(path)


def consecutive(spark, d, tables, feeder, args, timed_barrier) -> dict:
    """--consecutive N barriers of 0.1% changes each (compaction included, as in production):
    every barrier's time, and the time to read the whole MV at the end against the same read
    once the MV is freshly compacted (what merge-on-read costs readers)."""
    from backfill_assets import storage
    from backfill_assets.storage.writes import maintain

    changes = max(1, round(args.rows * 0.001))
    times = []
    for i in range(args.consecutive):
        feeder.apply(changes)
        secs, _, rep = timed_barrier()
        times.append(round(secs, 3))
        if i % 20 == 0:
            print(f"  consecutive barrier {i + 1}/{args.consecutive}: {secs:.2f}s "
                  f"({rep.engine})", flush=True)
    snap = storage.TableVersion.load(tables.mv)
    files = {"files": len(snap.files), "files_with_dv": sum(1 for f in snap.files
                                                           if f.deletion_vector)}
    read_now = _read_seconds(spark, tables.mv)
    maintain.compact(spark, snap, [c.name for c in d.primary_key], force=True)
    read_compacted = _read_seconds(spark, tables.mv)
    med = statistics.median(times)
    return {"barriers": len(times), "changes_each": changes, "seconds": times,
            "median": med, "max": max(times), "max_over_median": round(max(times) / med, 2),
            "first20_median": statistics.median(times[:20]),
            "last20_median": statistics.median(times[-20:]),
            "read_seconds": read_now, "read_seconds_compacted": read_compacted,
            "read_ratio": round(read_now / read_compacted, 2), **files}


def _read_seconds(spark, uri: str, repeat: int = 3) -> float:
    """Median time to read every live row of the table with the layer's Spark reader."""
    from backfill_assets import storage

    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        storage.read_version(spark, uri, None).write.format("noop").mode("overwrite").save()
        runs.append(time.perf_counter() - t0)
    return round(statistics.median(runs), 3)


def run(args) -> dict:
    res: dict = {"machine": C.machine_info(), "args": vars(args), "runs": []}
    prev = C.Previous(args.name, args.fresh)
    for pk in args.pk:
        common = ["--rows", str(args.rows), "--pk", pk, "--vnodes", str(args.vnodes)]
        C.run_worker("benchmarks.bench_bulk", ["worker-prepare", *common])
        for mode in args.modes:
            again = prev.find("runs", rows=args.rows, pk=pk, mode=mode)
            if again:
                res["runs"].append(again)
                continue
            extra = ["--repeat", str(args.repeat), "--mode", mode,
                     "--fractions", *map(str, args.fractions)]
            extra += ["--barrier-rows", str(args.barrier_rows),
                      "--consecutive", str(args.consecutive)]
            res["runs"].append(C.run_clean("benchmarks.bench_incremental",
                                            ["worker", *common, *extra]))
            path = C.save_results(args.name, res)
    print_report(res)
    print(f"\nresults: {path}")
    return res


def print_report(res: dict) -> None:
    print("\nIncremental barrier on a finished MV vs the naive full refresh (median seconds)")
    rows = []
    for r in res["runs"]:
        full = r["full_refresh_median"]
        for c in r["cases"]:
            idle = r["cases"][0]["median_seconds"]
            per_row = ((c["median_seconds"] - idle) * 1000 / c["changes"]
                       if c["changes"] else None)
            rows.append([C.human_rows(r["rows"]), r["pk"], r["mode"],
                         f"{c['fraction'] * 100:g}%", c["changes"], c["median_seconds"], full,
                         f"{full / c['median_seconds']:.1f}x",
                         f"{per_row:.3f}" if per_row is not None else "-"])
    C.print_table(["rows", "pk", "mode", "changed", "changes", "barrier s", "full refresh s",
                   "refresh / barrier", "ms per changed row"], rows)
    for r in res["runs"]:
        c = r.get("consecutive")
        if c:
            print(f"\n{c['barriers']} consecutive 0.1% barriers ({r['mode']}, "
                  f"{C.human_rows(r['rows'])}): median {c['median']:.2f}s, max {c['max']:.2f}s "
                  f"(max/median {c['max_over_median']}), first 20 {c['first20_median']:.2f}s, "
                  f"last 20 {c['last20_median']:.2f}s; MV read {c['read_seconds']:.2f}s vs "
                  f"{c['read_seconds_compacted']:.2f}s compacted ({c['read_ratio']}x), "
                  f"{c['files']} files, {c['files_with_dv']} with a DV")
    print("\nPhases of the median barrier (wall / driver CPU / JVM CPU seconds)")
    for r in res["runs"]:
        for c in r["cases"]:
            print(f"-- {r['mode']} {c['fraction'] * 100:g}% ({c['median_seconds']:.2f}s)")
            C.print_table(["phase", "wall s", "driver cpu s", "jvm cpu s"],
                          [[k, *v] for k, v in c["median_run"]["phases"].items() if v[0] >= 0.01])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    for parser in (p, sub.add_parser("worker")):
        parser.add_argument("--rows", type=int, default=5_000_000)
        parser.add_argument("--vnodes", type=int, default=256)
        parser.add_argument("--fractions", type=float, nargs="+", default=[0.0001, 0.001, 0.01])
        parser.add_argument("--repeat", type=int, default=3)
        parser.add_argument("--barrier-rows", type=int, default=0,
                            help="snapshot rows per barrier of the initial backfill (0: one "
                                 "barrier in arrangement, 1M rows in no_shuffle)")
        parser.add_argument("--max-barriers", type=int, default=400)
        parser.add_argument("--consecutive", type=int, default=0,
                            help="then N consecutive 0.1%% barriers (flat time, read cost)")
    p.add_argument("--pk", nargs="+", default=["single"], choices=C.PK_SHAPES)
    p.add_argument("--modes", nargs="+", default=["snapshot"], choices=MODES)
    p.add_argument("--name", default="incremental")
    p.add_argument("--fresh", action="store_true", help="ignore results of an earlier run")
    w = sub.choices["worker"]
    w.add_argument("--pk", default="single", choices=C.PK_SHAPES)
    w.add_argument("--mode", default="snapshot", choices=MODES)
    args = p.parse_args(argv)
    C.dispatch(args, {"worker": worker}, run)


if __name__ == "__main__":
    sys.exit(main())
