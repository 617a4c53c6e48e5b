"""What a keyed commit into a join index pays to find the rows it replaces, by the key it finds
them by: the index's own key (join key, fact pk), two integer columns, which the storage
layer's key cache probes by a hash join over every kept key of every file a change meets, or
the fact pk alone (`JoinStore.write_key`), a single integer key found by a binary search in
the kept sorted keys (storage/rows/key_cache.py's `FileKeys.rows_of`, the code a warm
barrier's lookup runs; no file is read: the keys are the cache's, as in a warm process).

    .venv/bin/python -m benchmarks.index_key_lookup --rows 2000000 20000000 --changes 20000

The index's rows are spread over ``--files`` files (the keys of a fact barrier's changed
orders meet every one of them); each run times the lookups of ``--changes`` changed facts'
keys, each file probed with its share, the median of three.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa

from backfill_assets.storage.rows.key_cache import FileKeys


def _files(rows: int, files: int, customers: int, rng: np.random.Generator
           ) -> list[pa.Table]:
    ids = rng.permutation(rows).astype(np.int64)
    cust = (ids * 7919) % customers
    per = -(-rows // files)
    return [pa.table({"customer": cust[i:i + per], "id": ids[i:i + per]})
            for i in range(0, rows, per)]


def _time(kept: list[FileKeys], wanted: list[pa.Table], names: list[str]) -> float:
    types = [pa.int64()] * len(names)
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        for keys, want in zip(kept, wanted, strict=True):
            keys.rows_of(want.select(names), names, types)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 20_000_000])
    parser.add_argument("--changes", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    for rows in args.rows:
        tables = _files(rows, args.files, max(1, rows // 20), rng)
        wanted = [t.take(rng.choice(t.num_rows, max(1, args.changes // len(tables)),
                                    replace=False)) for t in tables]
        both = [FileKeys.of(t) for t in tables]
        pk = [FileKeys.of(t.select(["id"])) for t in tables]
        two, one = _time(both, wanted, ["customer", "id"]), _time(pk, wanted, ["id"])
        print(f"{rows:>11,} rows, {args.changes:,} changes in {len(tables)} files: "
              f"(join key, pk) {two:.3f} s, pk alone {one:.3f} s")


if __name__ == "__main__":
    main()
