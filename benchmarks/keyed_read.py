"""Keyed reads of a join index: ``storage.rows_of_keys`` (only the row groups whose statistics
admit a key) against today's read by vnode (the keys' vnodes read whole, then filtered).

A dimension barrier of 1,000 changed keys must read their ~20,000 index rows; the keys hash
to nearly all 256 vnodes, so the read by vnode reads the whole 20M-row table
(docs/JOINS.md, "Measured"). The script writes a 20M-row table like the join index (join_key
int64 over 1M keys, order_id int64, amount decimal(10,2), day date, vnode of join_key out
of 256) through the platform's keyed commit (files sorted by (vnode, key)), once per row-group
size asked, then times both reads of the same random keys (1,000 and 20,000), each the
median of ``--repeat`` runs on fresh keys; ``rows_of_keys`` cold (a process's first read:
footers not cached yet, the table version loaded as the barrier has it) and warm.
Results: results/keyed_read.json.

    python -m benchmarks.keyed_read [--rows 20000000] [--group-rows 1024,2048,4096,16384]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

from benchmarks.common import save_results

VNODES = 256


def make_rows(rows: int, keys: int, seed: int = 1) -> pa.Table:
    """Index rows: each order's join key drawn from ``keys`` customers, its vnode the
    platform's hash of the key (core/vnode.py)."""
    from backfill_assets.core.vnode import vnodes_of

    rng = np.random.default_rng(seed)
    join_key = rng.integers(0, keys, rows, dtype=np.int64)
    of_key = np.array(vnodes_of([(int(k),) for k in range(keys)], ["bigint"], VNODES),
                      dtype=np.int32)
    cents = pa.array(rng.integers(0, 10**6, rows, dtype=np.int64))
    amount = pa.Array.from_buffers(pa.decimal128(10, 2), rows, [None, pa.py_buffer(
        np.stack([cents.to_numpy(), np.zeros(rows, np.int64)], axis=1).tobytes())])
    day = (np.datetime64("2024-01-01") + rng.integers(0, 365, rows)).astype("datetime64[D]")
    return pa.table({
        "join_key": join_key, "order_id": np.arange(rows, dtype=np.int64),
        "amount": amount,
        "day": pa.array(day, pa.date32()), "vnode": of_key[join_key]})


def write_index(uri: str, rows: pa.Table, group_rows: int) -> float:
    """The rows as the platform writes a keyed table: one keyed commit, files clustered by
    (vnode, key) in row groups of ``group_rows``. Seconds taken."""
    from backfill_assets.storage import (
        ROW_GROUP_ROWS_PROPERTY,
        Intent,
        KeyedRows,
        TableVersion,
        apply_keyed,
        ensure_mor_table,
    )

    start = time.perf_counter()
    ensure_mor_table(uri, rows.schema, None, cdf=False, configuration={
        "backfill.vnodeCount": str(VNODES), ROW_GROUP_ROWS_PROPERTY: str(group_rows)})
    apply_keyed(TableVersion.load(uri), ["join_key", "order_id"], Intent({"bench/index/0": 0}),
                KeyedRows(rows.schema.empty_table(), rows))
    return time.perf_counter() - start


def by_vnode(uri: str, keys: pa.Table) -> pa.Table:
    """Today's read (join/store.py's ``read``): the keys' vnodes through delta-rs, then the
    rows of the keys."""
    from backfill_assets.mv.owned_tables import read_rows
    from backfill_assets.storage import open_table

    vnodes = sorted(set(keys.column("vnode").to_pylist()))
    rows = read_rows(open_table(uri), vnodes)
    return rows.join(keys.select(["join_key"]), keys="join_key", join_type="left semi",
                     use_threads=False)


def by_row_group(uri: str, keys: pa.Table) -> pa.Table:
    from backfill_assets.storage import TableVersion, rows_of_keys

    return rows_of_keys(TableVersion.load(uri), ["join_key"], keys)


def timed(read, uri: str, keys: pa.Table) -> tuple[float, int]:
    start = time.perf_counter()
    rows = read(uri, keys).num_rows
    return time.perf_counter() - start, rows


def measure(uri: str, counts: list[int], key_space: int, repeat: int, seed: int) -> dict:
    """Per key count: median seconds and rows of both reads, rows_of_keys cold and warm, and
    the rows of the row groups it opened."""
    from backfill_assets.core.vnode import vnodes_of
    from backfill_assets.storage import TableVersion, clear_all
    from backfill_assets.storage.rows.keyed_read import row_groups_read

    rng = np.random.default_rng(seed)
    out = {}
    for count in counts:
        runs = []
        for _ in range(repeat):
            chosen = rng.choice(key_space, count, replace=False).astype(np.int64)
            keys = pa.table({"join_key": chosen, "vnode": pa.array(
                vnodes_of([(int(k),) for k in chosen], ["bigint"], VNODES), pa.int32())})
            clear_all()  # cold: no footer cached; the version loaded, as a barrier has it
            TableVersion.load(uri)
            cold = timed(by_row_group, uri, keys)
            warm = timed(by_row_group, uri, keys)
            vnode = timed(by_vnode, uri, keys)
            assert cold[1] == warm[1] == vnode[1], (cold, warm, vnode)
            snap = TableVersion.load(uri)
            sizes = {f.path: f for f in snap.files}
            opened = row_groups_read(snap, ["join_key"], keys)
            groups = sum(len(g) for g in opened.values())
            runs.append({"cold": cold[0], "warm": warm[0], "vnode": vnode[0], "rows": cold[1],
                         "groups": groups, "files": len(sizes)})
        out[str(count)] = {
            "keys": count, "rows_found": int(statistics.median(r["rows"] for r in runs)),
            "row_groups_read": int(statistics.median(r["groups"] for r in runs)),
            "rows_of_keys_cold_s": round(statistics.median(r["cold"] for r in runs), 3),
            "rows_of_keys_warm_s": round(statistics.median(r["warm"] for r in runs), 3),
            "by_vnode_s": round(statistics.median(r["vnode"] for r in runs), 3),
            "runs": runs}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct join keys")
    p.add_argument("--group-rows", default="1024,2048,4096,16384")
    p.add_argument("--counts", default="1000,20000")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    rows = make_rows(args.rows, args.keys)
    counts = [int(c) for c in args.counts.split(",")]
    result = {"rows": args.rows, "join_keys": args.keys, "vnodes": VNODES,
              "source": _source(), "by_group_rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for group_rows in [int(g) for g in args.group_rows.split(",")]:
            uri = os.path.join(tmp, f"index_{group_rows}")
            wrote = write_index(uri, rows, group_rows)
            figures = measure(uri, counts, args.keys, args.repeat, seed=group_rows)
            result["by_group_rows"][str(group_rows)] = {
                "write_s": round(wrote, 2), "table_bytes": _bytes(uri), **figures}
            for count, f in figures.items():
                print(f"groups of {group_rows}: {count} keys -> {f['rows_found']} rows; "
                      f"rows_of_keys {f['rows_of_keys_warm_s']} s warm, "
                      f"{f['rows_of_keys_cold_s']} s cold ({f['row_groups_read']} groups); "
                      f"by vnode {f['by_vnode_s']} s", flush=True)
    print(save_results("keyed_read", result))


def _bytes(uri: str) -> int:
    from backfill_assets.storage import TableVersion

    return sum(f.size or 0 for f in TableVersion.load(uri).files)


def _source() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "BENCH_SOURCE")
    return open(path).read().strip() if os.path.exists(path) else "working tree"


if __name__ == "__main__":
    main()
