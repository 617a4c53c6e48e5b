"""Aggregate MVs against what users run instead, in one run on the same rows (issue 49's
targets; docs/BENCHMARKS.md opens with them).

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.bench_aggregate --rows 1000000
    .venv/bin/python -m benchmarks.bench_aggregate            # 20M rows, ~100k groups

The upstream (benchmarks/agg_data.py): N orders (`region`, `id`, `amount` the price
decimal(12,2), `qty`, `day`) in about --groups (region, day) groups; the aggregate

    SELECT region, day, sum(amount * qty) AS revenue, count(*) AS orders,
           avg(amount) AS avg_price FROM orders GROUP BY region, day

Each contender runs in a fresh process under `flock $BENCH_LOCK` on its own copy of the same
cached upstream and receives the same DML batches in the same order (--repeat batches of
0.1% of N, then --repeat of 0.01%: group moves, in-place updates, deletes, inserts):
  sdp        Spark Declarative Pipelines' `@dp.materialized_view(format="delta")`
             (benchmarks/agg_sdp.py): the first run (full computation), a run after each batch;
  overwrite  delta-spark GROUP BY + overwrite (benchmarks/agg_baselines.py), the same;
  merge      foreachBatch + MERGE of signed deltas from the change feed, one availableNow
             query after each batch (benchmarks/agg_baselines.py);
  platform   `run_barrier` on the aggregate MV definition (benchmarks/agg_platform.py): the bulk
             backfill, then one barrier after each batch; "not served yet" where this checkout
             refuses aggregate MVs (AggregateMVNotServed).
Every contender's final MV is compared with Spark's GROUP BY of the final upstream (rows of
each side missing from the other). Results: benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C
from benchmarks.agg_report import print_report, targets

CONTENDERS = ("sdp", "overwrite", "merge", "platform")


def worker_prepare(args) -> dict:
    return A.prepare_orders(args.rows, args.groups, args.vnodes)


def _worker_args(args) -> list[str]:
    return ["--rows", str(args.rows), "--groups", str(args.groups), "--vnodes",
            str(args.vnodes), "--fractions", *map(str, args.fractions), "--repeat",
            str(args.repeat), "--commits", str(args.commits), "--interval", str(args.interval),
            "--commit-changes", str(args.commit_changes)]


def run(args) -> dict:
    name = args.name or f"aggregate_{C.human_rows(args.rows)}"
    out: dict = {"machine": C.machine_info(), "args": vars(args), "sql": A.SQL,
                 "contenders": {}}
    n = _worker_args(args)
    out["upstream"] = C.run_worker("benchmarks.bench_aggregate", ["worker-prepare", *n])
    for contender in args.contenders:
        print(f"== {contender}", flush=True)
        try:
            result = C.run_worker("benchmarks.bench_aggregate", [f"worker-{contender}", *n])
        except RuntimeError as e:  # one contender's failure must not lose the others'
            result = {"failed": str(e)}
            print(f"    {contender} failed: {e}", flush=True)
        out["contenders"][contender] = result
        C.save_results(name, out)
    out["targets"] = targets(out)
    path = C.save_results(name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def main(argv=None) -> None:
    from benchmarks.agg_baselines import worker_merge, worker_overwrite
    from benchmarks.agg_platform import worker_platform
    from benchmarks.agg_sdp import worker_sdp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    workers = {"worker-prepare": worker_prepare, "worker-sdp": worker_sdp,
               "worker-overwrite": worker_overwrite, "worker-merge": worker_merge,
               "worker-platform": worker_platform}
    for parser in (p, *(sub.add_parser(w) for w in workers)):
        R.add_worker_args(parser)
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--name", default="", help="results/<name>.json (default aggregate_<rows>)")
    args = p.parse_args(argv)
    C.dispatch(args, workers, run)


if __name__ == "__main__":
    sys.exit(main())
