"""What the storage layer's keyed commit (`storage.apply_keyed`) costs alone, without Spark or
an upstream: a table written once, then barriers that each replace ``--keys`` held keys, the
wall time of each commit printed. Two shapes: ``group``, an aggregate MV's (100k rows keyed
by a group text, one string column, as `aggregate/store.py` keys it) and ``row``, a row MV's
(``--rows`` rows keyed by an integer id). Pure Python: no lock needed, but run old and new code
alternately on the same machine state, from outside the tree so that ``PYTHONPATH`` decides
which code runs (a frozen copy's, then the tree's; the tree gives the benchmark itself):

    cd /tmp && PYTHONPATH=$OLD:$TREE $TREE/.venv/bin/python -m benchmarks.keyed_commit \
        --shape group --keys 23000

``--whole`` gives each commit every held row (`apply_keyed(whole=...)`, as aggregate/store.py
does), so the storage layer may rewrite the table instead of giving it DVs
(`storage/rows/keyed_rewrite.py`); ``--compact`` runs the compaction each commit makes due
(`storage.compaction_due`, then `storage.compact` on the driver), timed apart: the deferred
cost of the DV path, which a barrier pays in a background thread on the same cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

GROUPS = 100_000
GROUP_KEY = "__bf_group"


def _group_rows(ids: np.ndarray, salt: int) -> pa.Table:
    """An aggregate MV's rows for group numbers ``ids`` (region, day, sums, the key text)."""
    return pa.table({
        "region": pa.array([f"r{i % 5}" for i in ids]),
        "day": pa.array(ids // 5, pa.int32()).cast(pa.date32()),
        "revenue": pa.array((ids * 3 + salt) % 10**9, pa.int64()).cast(pa.decimal128(38, 4)),
        "orders": pa.array(ids + salt, pa.int64()),
        GROUP_KEY: pa.array([json.dumps([f"r{i % 5}", str(i // 5)]) for i in ids]),
        "vnode": pa.array((ids * 7919) % 256, pa.int32())})


def _row_rows(ids: np.ndarray, salt: int) -> pa.Table:
    """A row MV's rows for ids ``ids``."""
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array(np.char.add("r", (ids % 5).astype(str))),
        "amount": pa.array((ids * 3 + salt) % 10**6, pa.int32()).cast(pa.decimal128(12, 2)),
        "vnode": pa.array((ids * 7919) % 256, pa.int32())})


def run(shape: str, keys: int, rows: int, barriers: int, whole: bool = False,
        compact: bool = False) -> tuple[list[float], list[float]]:
    """The seconds of each barrier's commit (the table's first write not counted), and of
    the compaction after it (0 when none was due or ``compact`` is off)."""
    from backfill_assets.mv import owned_tables

    make, key, total = ((_group_rows, GROUP_KEY, GROUPS) if shape == "group"
                        else (_row_rows, "id", rows))
    held = make(np.arange(total), 0)
    folder = tempfile.mkdtemp(prefix="keyed_commit_")
    try:
        uri = f"{folder}/mv"
        owned_tables.ensure_data_table(uri, held.schema, {}, cdf=True, key_names=[key],
                                       vnode_count=256)
        _commit(uri, key, 1, held.schema.empty_table(), held, None)
        rng, seconds, compacted = np.random.default_rng(1), [], []
        for barrier in range(2, barriers + 2):
            ids = np.sort(rng.choice(total, keys, replace=False))  # held row i is id/group i
            after = make(ids, barrier)
            took, done = _commit(uri, key, barrier, held.take(pa.array(ids)), after,
                                 held if whole else None)
            seconds.append(took)
            compacted.append(_compacted(uri, key, done) if compact else 0.0)
            keep = np.ones(total, bool)
            keep[ids] = False
            order = np.argsort(np.concatenate([np.flatnonzero(keep), ids]), kind="stable")
            held = pa.concat_tables([held.filter(pa.array(keep)), after]).take(pa.array(order))
        return seconds, compacted
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _commit(uri: str, key: str, version: int, before: pa.Table, after: pa.Table,
            whole: pa.Table | None) -> tuple[float, tuple]:
    from backfill_assets import storage
    from backfill_assets.mv import owned_tables

    snap = storage.TableVersion.load(uri, None, {})
    intent = owned_tables.intent("bench", "mv", range(256), version)
    extra = {} if whole is None else {"whole": whole}  # an old tree's apply_keyed has no whole
    t0 = time.perf_counter()
    applied = storage.apply_keyed(snap, [key], intent, storage.KeyedRows(before, after),
                                  **extra)
    return time.perf_counter() - t0, (snap, applied)


def _compacted(uri: str, key: str, done: tuple) -> float:
    """The seconds of the compaction ``done`` (a commit's version and result) made due."""
    from backfill_assets import storage

    t0 = time.perf_counter()
    if storage.compaction_due(*done, range(256)):
        snap = storage.TableVersion.load(uri, None, {})
        storage.compact(None, snap, [key], range(256))  # driver-side at these sizes
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=("group", "row"), default="group")
    parser.add_argument("--keys", type=int, default=23_000)
    parser.add_argument("--rows", type=int, default=2_000_000, help="the row shape's rows")
    parser.add_argument("--barriers", type=int, default=6)
    parser.add_argument("--whole", action="store_true", help="give the held rows")
    parser.add_argument("--compact", action="store_true", help="compact when due, timed")
    args = parser.parse_args()
    seconds, compacted = run(args.shape, args.keys, args.rows, args.barriers, args.whole,
                             args.compact)
    total = [s + c for s, c in zip(seconds, compacted, strict=True)]
    print(f"{args.shape} {args.keys} keys{' whole' if args.whole else ''}: "
          f"{[round(s, 3) for s in seconds]}, median {statistics.median(seconds):.3f}s; "
          f"compactions {[round(c, 3) for c in compacted]}; commit + compaction mean "
          f"{statistics.mean(total):.3f}s")


if __name__ == "__main__":
    main()
