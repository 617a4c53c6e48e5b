"""The platform's aggregate barrier profiled (cProfile) on the aggregate benchmark's data
(benchmarks/agg_data.py): the bulk barrier, an idle one, one barrier after each batch of
``--changes`` changes, then ``--cont`` barriers of 20 changes each (continuous mode without
the interval), each table's files, and the final MV against Spark's GROUP BY. Where a figure
in docs/BENCHMARKS.md's aggregate section says what a path spends its time on, it is this:

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.agg_profile --rows 2000000 \\
        --changes 2000 200 --cont 40
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import time
from collections.abc import Callable

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C
from benchmarks.agg_platform import table_sizes


def _profiled(label: str, fn: Callable[[], object], top: int) -> None:
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    report = fn()
    profile.disable()
    print(f"=== {label}: {time.perf_counter() - t0:.3f}s {getattr(report, 'extra', None)}")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    R.add_worker_args(parser)
    parser.add_argument("--changes", type=int, nargs="+", default=[2000, 200])
    parser.add_argument("--cont", type=int, default=0)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.upstream.writer.dml import apply_dml

    run_dir, uri, info = R.private_upstream(args, "profile")
    d = A.definition(uri, args.vnodes)
    tables = MVTables.under(run_dir, d.name, uri)
    vnodes = list(range(args.vnodes))
    spark, _ = C.start_spark()
    C.warm_read(spark, uri)

    def barrier():
        return run_barrier(spark, d, tables, vnodes)

    try:
        _profiled("bulk", barrier, args.top)
        _profiled("idle", barrier, args.top)
        stream, spec = A.ChangeStream(args.rows, info["days"]), A.orders_spec(args.vnodes)
        for n in args.changes:
            apply_dml(uri, stream.batch(n)[0], spec=spec)
            _profiled(f"{n} changes", barrier, args.top)
        for i in range(args.cont):
            apply_dml(uri, stream.batch(20)[0], spec=spec)
            t0 = time.perf_counter()
            barrier()
            print(f"continuous {i}: {time.perf_counter() - t0:.3f}s")
        print(table_sizes(tables))
        print(R.mismatches(spark, spark.read.format("delta").load(tables.mv), uri))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
