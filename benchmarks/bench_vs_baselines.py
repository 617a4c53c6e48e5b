"""Issue 38's targets in one run: the platform's figures and what users would run instead,
measured one after the other on the same tables, each in a fresh process under
`flock $BENCH_LOCK` (benchmarks.baseline_runs).

    make bench-baselines                               # 5M rows, latency included
    .venv/bin/python -m benchmarks.bench_vs_baselines --rows 5000000 20000000 --no-latency

Per size N (the cached upstream of bench_bulk: 8 columns, single pk, 256 vnodes):
  1. ours, snapshot backfill end to end: bench_bulk's worker-backfill in snapshot mode (the
     bulk barrier at the bulk version, then the writer's DML batches of 0.01% of N, one per
     1M rows, then the catch-up barrier; the sum of both barriers' wall times), through
     benchmarks.vs_bulk (the bulk write timed as its own phase);
  2. baselines (a) and (c): benchmarks.baseline_delta_spark's worker (delta-spark full refresh
     of the bulk version, pyarrow copy, plain JVM Spark copy; --repeat each, medians);
  3. for N in --incremental-rows: ours, bench_incremental's worker in snapshot mode (an idle
     barrier, then --repeat barriers of each --fractions of N changes on the finished MV);
  4. baseline (b)'s cost: benchmarks.baseline_streaming's worker-cost on the same change sets
     (same writer seed and batch sizes), and the delta-spark full refresh of the final version.
Then, unless --no-latency: bench_latency's continuous path (`dagster dev`, the follower) at
one commit per 1 s and per 5 s on --latency-rows rows, and baseline (b)'s latency worker on
the same generated upstream and MV at the same rates (processingTime 0 and 1 s).
Prints every issue-38 target with its figure, its same-run baseline and whether it is met,
and the phases of the figures that miss; results: benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks import common as C
from benchmarks.baseline_runs import load_note, prepare
from benchmarks.baseline_runs import run as run_worker
from benchmarks.vs_targets import print_targets, targets


def latency_ours(args) -> dict:
    """bench_latency's continuous path, as `make bench-latency` runs it (the whole run under
    the lock: it starts `dagster dev`, whose follower runs Spark)."""
    name = f"{args.name}_latency_ours"
    cmd = [sys.executable, "-m", "benchmarks.bench_latency", "--paths", "continuous",
           "--intervals", *map(str, args.intervals), "--rows", str(args.latency_rows),
           "--commits", str(args.commits), "--name", name]
    if not C.lock_held_above():
        cmd = ["flock", C.LOCK, *cmd]
    subprocess.run(cmd, cwd=C.ROOT, check=True)
    with open(os.path.join(C.RESULTS_DIR, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def run(args) -> dict:
    out: dict = {"machine": C.machine_info(), "args": vars(args), "sizes": []}
    common = ["--pk", "single", "--vnodes", str(args.vnodes)]
    for rows in [] if args.latency_only else args.rows:
        n = ["--rows", str(rows)]
        print(f"== {C.human_rows(rows)} rows ({load_note()})", flush=True)
        prepare(rows, "single", args.vnodes)
        size: dict = {"rows": rows}
        out["sizes"].append(size)
        size["snapshot_backfill"] = run_worker("benchmarks.vs_bulk", [
            "worker-backfill", *n, *common, "--mode", "snapshot", "--barrier-rows", "1000000",
            "--dml-fraction", "0.0001", "--budget", "0",
            *(["--catch-up-batches", str(args.catch_up_batches)] if args.catch_up_batches
              else [])])
        size["snapshot_backfill"]["load"] = load_note()
        C.save_results(args.name, out)
        size["refresh_and_floors"] = run_worker("benchmarks.baseline_delta_spark", [
            "worker", *n, *common, "--repeat", str(args.repeat),
            *(["--no-floors"] if rows > args.floors_max_rows else [])])
        C.save_results(args.name, out)
        if rows in args.incremental_rows:
            fractions = ["--fractions", *map(str, args.fractions)]
            size["incremental"] = run_worker("benchmarks.bench_incremental", [
                "worker", *n, *common, "--mode", "snapshot", "--repeat", str(args.inc_repeat),
                *fractions])
            size["incremental"]["load"] = load_note()
            C.save_results(args.name, out)
            size["streaming_cost"] = run_worker("benchmarks.baseline_streaming", [
                "worker-cost", *n, *common, "--repeat", str(args.inc_repeat), *fractions])
            C.save_results(args.name, out)
    if args.latency:
        out["latency_ours"] = latency_ours(args)
        C.save_results(args.name, out)
        out["latency_streaming"] = run_worker("benchmarks.baseline_streaming", [
            "worker-latency", "--latency-rows", str(args.latency_rows), *common,
            "--intervals", *map(str, args.intervals), "--triggers", "0", "1",
            "--commits", str(args.commits)])
    out["targets"] = targets(out)
    path = C.save_results(args.name, out)
    print_targets(out)
    print(f"\nresults: {path}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000])
    p.add_argument("--incremental-rows", type=int, nargs="+", default=[5_000_000],
                   help="sizes at which the barriers and the streaming pattern's cost run")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0001, 0.001, 0.01])
    p.add_argument("--vnodes", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3, help="repeats of the refresh and copies")
    p.add_argument("--inc-repeat", type=int, default=3, help="barriers / batches per fraction")
    p.add_argument("--floors-max-rows", type=int, default=100_000_000,
                   help="above this size, the delta-spark refresh only")
    p.add_argument("--catch-up-batches", type=int, default=0,
                   help="the writer's versions the snapshot's catch-up takes (default: one per "
                        "1M rows, at most 20: at 100M each batch costs the writer about a minute)")
    p.add_argument("--no-latency", dest="latency", action="store_false")
    p.add_argument("--latency-only", action="store_true", help="the latency pair alone")
    p.add_argument("--latency-rows", type=int, default=1_000_000)
    p.add_argument("--intervals", type=float, nargs="+", default=[1.0, 5.0])
    p.add_argument("--commits", type=int, default=40)
    p.add_argument("--name", default="vs_baselines")
    run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
