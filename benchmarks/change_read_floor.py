"""What reading one commit's change files costs with nothing else done: the floor under a small
barrier's change read (docs/BENCHMARKS.md, "Where the missed targets are bound").

A DML commit on the benchmark's vnode-partitioned upstream writes one change file per vnode
partition it touches (256 for a 0.1% batch). The script makes one such commit on a copy of
the cached upstream (the writer in its own process, as the benchmarks do), then reads that
version's change files each way a reader could, best of ``--repeat``, and prints the
milliseconds of each (wall, and the process's CPU time: two threads that overlap spend
more CPU than wall) beside the storage layer's own read of the range
(``storage/rows/change_range.read_raw_changes``, which also checks the range and casts).
``--orders``: the aggregate benchmark's upstream instead (benchmarks/agg_data.py, its DML
applied in this process), the one issue 49's barrier figures read.

    python -m benchmarks.change_read_floor [--rows 5000000] [--changes 5000] [--orders]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from benchmarks import common as C


def _best(read: Callable[[], pa.Table], repeat: int) -> tuple[float, float, int]:
    """(best wall ms, that run's CPU ms, rows)."""
    runs, rows = [], 0
    for _ in range(repeat):
        t, cpu = time.perf_counter(), time.process_time()
        rows = read().num_rows
        runs.append((time.perf_counter() - t, time.process_time() - cpu))
    wall, cpu = min(runs)
    return wall * 1000, cpu * 1000, rows


def _ways(files: list[str], columns: list[str]) -> dict[str, Callable[[], pa.Table]]:
    def one(path: str) -> pa.Table:
        return pq.ParquetFile(path, pre_buffer=False).read(columns=columns, use_threads=False)

    def whole(path: str) -> pa.Table:  # the storage layer's way (storage/rows/change_feed.py)
        with open(path, "rb") as f:
            data = f.read()
        return pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)

    pool = ThreadPoolExecutor(2)
    return {
        "ParquetFile.read, one after the other": lambda: pa.concat_tables(
            [one(f) for f in files]),
        "whole bytes, then ParquetFile.read": lambda: pa.concat_tables(
            [whole(f) for f in files]),
        "ParquetFile.read, two threads": lambda: pa.concat_tables(list(pool.map(one, files))),
        "ParquetFile.read, two threads, halves": lambda: pa.concat_tables([
            t for half in pool.map(lambda part: [one(f) for f in part],
                                   [files[0::2], files[1::2]]) for t in half]),
        "dataset scan": lambda: ds.dataset(files, format="parquet").to_table(columns=columns),
        "read_table per file": lambda: pa.concat_tables(
            [pq.read_table(f, columns=columns, use_threads=False) for f in files]),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--changes", type=int, default=5_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--orders", action="store_true")
    args = p.parse_args(argv)
    from backfill_assets.storage import read_raw_changes

    run_dir = os.path.join(C.WORK_DIR, f"change_floor_{os.getpid()}")
    uri, apply = _upstream(args, run_dir)
    try:
        version = apply()
        with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as log:
            actions = [json.loads(line) for line in log]
        files = [os.path.join(uri, a["cdc"]["path"]) for a in actions if "cdc" in a]
        columns = pq.ParquetFile(files[0]).schema_arrow.names
        print(f"version {version}: {len(files)} change files, {args.changes:,} changes")
        for name, read in _ways(files, columns).items():
            ms, cpu, rows = _best(read, args.repeat)
            print(f"  {name:40s} {ms:7.1f} ms (CPU {cpu:6.1f})  ({rows:,} rows, "
                  f"{ms / len(files):.3f} ms a file)")
        ms, cpu, rows = _best(lambda: read_raw_changes(uri, version - 1, version),
                              args.repeat)
        print(f"  {'read_raw_changes (the storage layer)':40s} {ms:7.1f} ms (CPU {cpu:6.1f})  "
              f"({rows:,} rows)")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _upstream(args, run_dir: str) -> tuple[str, Callable[[], int]]:
    """The private upstream copy and what applies the one DML commit (its version)."""
    if args.orders:
        from backfill_assets.upstream.writer.dml import apply_dml
        from benchmarks import agg_data as A

        info = A.prepare_orders(args.rows, 100_000, 256)
        uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
        stream = A.ChangeStream(args.rows, info["days"])
        return uri, lambda: apply_dml(uri, stream.batch(args.changes)[0],
                                      spec=A.orders_spec(256))
    info = C.prepare_upstream(args.rows, "single", 256)
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))

    def apply() -> int:
        feeder = C.DmlFeeder(uri, "single", 256, next_id=args.rows, seed=7)
        try:
            return feeder.apply(args.changes)["version"]
        finally:
            feeder.close()

    return uri, apply


if __name__ == "__main__":
    main()
