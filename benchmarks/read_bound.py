"""What reading a Delta version's files costs, with nothing else done: the floor under any
engine that must read those files.

no_shuffle over an upstream whose files each span their vnode's whole key range reads every
live file at every barrier (docs/BENCHMARKS.md, round 17): its cost is bounded below by
barriers x this read. The script reads every live file of the version (the columns given,
default all) with pyarrow on ``--threads`` threads, as the chunk tasks do, and prints rows,
seconds and ns per row; the best of ``--repeat`` runs.

    python -m benchmarks.read_bound /tmp/bench_work/<run>/upstream [--version V] [--columns id]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq

from backfill_assets.storage import TableVersion


def read_all(snap: TableVersion, columns: list[str] | None, threads: int) -> int:
    """Rows read: every live file of ``snap``, whole (DVs are not applied: the read is the
    cost, and the platform's upstream has none). A file is opened as the storage layer opens
    it (``pq.ParquetFile``, then one read of the columns): ``pq.read_table`` builds a dataset
    per call, which over the writer's 1,860 small files took 0.6 s of a 1.8 s read (round 22)."""
    physical = None if columns is None else [snap.physical_names.get(c, c) for c in columns
                                             if c not in snap.partition_columns]

    def one(path: str) -> int:
        return pq.ParquetFile(snap.file_uri(path)).read(columns=physical,
                                                        use_threads=False).num_rows

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, [f.path for f in snap.files]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table")
    p.add_argument("--version", type=int, default=None)
    p.add_argument("--columns", nargs="*", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    snap = TableVersion.load(args.table, args.version)
    best = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        rows = read_all(snap, args.columns, args.threads)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    print(f"version {snap.version}: {len(snap.files)} files, {rows:,} rows, columns "
          f"{args.columns or 'all'}, {args.threads} threads: best {best:.2f} s, "
          f"{best / max(rows, 1) * 1e9:.0f} ns/row")


if __name__ == "__main__":
    main()
