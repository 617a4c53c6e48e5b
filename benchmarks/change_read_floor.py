"""What reading one commit's change files costs with nothing else done: the floor under a small
barrier's change read (docs/BENCHMARKS.md, "Where the missed targets are bound").

A DML commit on the benchmark's vnode-partitioned upstream writes one change file per vnode
partition it touches (256 for a 0.1% batch). The script makes one such commit on a copy of
the cached upstream (the writer in its own process, as the benchmarks do), then reads that
version's change files each way a reader could, best of ``--repeat``, and prints the
milliseconds of each beside the storage layer's own read of the range
(``storage/rows/change_range.read_raw_changes``, which also checks the range and casts).

    python -m benchmarks.change_read_floor [--rows 5000000] [--changes 5000]
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


def _best(read: Callable[[], pa.Table], repeat: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = read().num_rows
        times.append(time.perf_counter() - t)
    return min(times) * 1000, rows


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
        "dataset scan": lambda: ds.dataset(files, format="parquet").to_table(columns=columns),
        "read_table per file": lambda: pa.concat_tables(
            [pq.read_table(f, columns=columns, use_threads=False) for f in files]),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--changes", type=int, default=5_000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    from backfill_assets.storage import read_raw_changes

    info = C.prepare_upstream(args.rows, "single", 256)
    run_dir = os.path.join(C.WORK_DIR, f"change_floor_{os.getpid()}")
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
    feeder = C.DmlFeeder(uri, "single", 256, next_id=args.rows, seed=7)
    try:
        version = feeder.apply(args.changes)["version"]
        with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as log:
            actions = [json.loads(line) for line in log]
        files = [os.path.join(uri, a["cdc"]["path"]) for a in actions if "cdc" in a]
        columns = pq.ParquetFile(files[0]).schema_arrow.names
        print(f"version {version}: {len(files)} change files, {args.changes:,} changes")
        for name, read in _ways(files, columns).items():
            ms, rows = _best(read, args.repeat)
            print(f"  {name:40s} {ms:7.1f} ms  ({rows:,} rows, {ms / len(files):.3f} ms a file)")
        ms, rows = _best(lambda: read_raw_changes(uri, version - 1, version),
                         args.repeat)
        print(f"  {'read_raw_changes (the storage layer)':40s} {ms:7.1f} ms  ({rows:,} rows)")
    finally:
        feeder.close()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
