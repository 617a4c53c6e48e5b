"""What every contender of the aggregate benchmark does the same way: its private copy of the
cached orders upstream, the full computation timed, then the shared DML plan (each batch
applied by the platform's writer, then the contender's refresh timed), and the result checked
against Spark's own GROUP BY of the final upstream (benchmarks/bench_aggregate.py)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from benchmarks import agg_data as A
from benchmarks import common as C


def add_worker_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--vnodes", type=int, default=256)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.001, 0.0001])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--commits", type=int, default=40,
                        help="continuous mode: upstream commits measured, one per --interval")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--commit-changes", type=int, default=20,
                        help="continuous mode: changes per upstream commit")


def private_upstream(args, label: str) -> tuple[str, str, dict]:
    """(run folder, the upstream's private copy, the cached table's info)."""
    info = A.prepare_orders(args.rows, args.groups, args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"agg_{label}_{os.getpid()}")
    return run_dir, C.work_copy(info["path"], os.path.join(run_dir, "upstream")), info


def follow_plan(args, uri: str, info: dict, refresh: Callable[[], dict],
                stream: A.ChangeStream | None = None) -> list[dict]:
    """Apply the plan's batches to `uri` in order, `refresh()` (a dict with at least
    `seconds`) after each; per fraction, the runs and their median. `stream`: the DML
    sequence to draw from (a fresh one by default), left where the plan ends."""
    from backfill_assets.upstream.writer.dml import apply_dml

    stream = stream or A.ChangeStream(args.rows, info["days"])
    spec = A.orders_spec(args.vnodes)
    cases: dict[float, dict] = {}
    for fraction, n in A.fraction_plan(args.rows, args.fractions, args.repeat):
        batch, counts = stream.batch(n)
        t0 = time.perf_counter()
        version = apply_dml(uri, batch, spec=spec)
        dml_s = time.perf_counter() - t0
        run = refresh()
        run.update(version=version, changes=n, kinds=counts, dml_seconds=round(dml_s, 3))
        case = cases.setdefault(fraction, {"fraction": fraction, "changes": n, "runs": []})
        case["runs"].append(run)
        print(f"    {fraction * 100:g}% ({n:,} changes, version {version}): "
              f"{run['seconds']:.3f}s", flush=True)
    for case in cases.values():
        case["median_seconds"] = round(statistics.median(r["seconds"] for r in case["runs"]), 3)
    return list(cases.values())


def recompute(spark, uri: str):
    """Spark's own GROUP BY of the upstream's latest version: the oracle."""
    return (spark.read.format("delta").load(uri).groupBy(*A.GROUP_COLUMNS)
            .agg(*(_expr(e) for e in A.AGG_EXPRS)))


def _expr(text: str):
    from pyspark.sql import functions as F

    return F.expr(text)


def mismatches(spark, mv, uri: str) -> dict:
    """Rows of the MV not in the recompute and rows of the recompute not in the MV (every
    output column compared exactly), and the MV's group count."""
    cols = [*A.GROUP_COLUMNS, "revenue", "orders", "avg_price"]
    mv = mv.select(*cols)
    oracle = recompute(spark, uri).select(*cols)
    return {"groups": mv.count(), "oracle_groups": oracle.count(),
            "mv_not_in_oracle": mv.exceptAll(oracle).count(),
            "oracle_not_in_mv": oracle.exceptAll(mv).count()}


def timed(fn: Callable[[], object]) -> dict:
    t0 = time.perf_counter()
    fn()
    return {"seconds": round(time.perf_counter() - t0, 3)}
