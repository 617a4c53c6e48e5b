"""The driver's memory per vnode and per key cached, each measured alone.

    PYTHONPATH=. python -m benchmarks.driver_memory [--vnodes 1024,65536] [--keys 1000000,8000000]

Why: the billion-row plan (docs/SCALE_OUT.md) sizes the driver from a per-vnode and a per-key
cost, and the whole-backfill peak (425 MiB at 100M rows) cannot separate them from the JVM's and
Dagster's share. Each figure here comes from a fresh child process that builds only that state
with the platform's own code, at two sizes, and reports the difference per unit (so the fixed
cost of imports and interpreters cancels out):

* per vnode: what a barrier's driver holds for each vnode of its range: the progress row as
  read (``codec.encode`` rows, the progress table's Arrow columns), its decoded progress in a
  ``BackfillState`` (committed and current, an InProgress position), and the Delta log's
  application transactions of its three tables (MV, replica, progress: ``owned_tables.txn_id``
  names mapped to versions, as the log replay keeps them) - for an integer key;
* per key cached: ``storage.rows.key_cache.KeyCache.file_keys`` over files of int64 keys (the
  sorted path: keys and their rows) and of (string, int64) keys (the hash-join path), against
  the cache's own count (``KeyCache.bytes``; ``CACHED_BYTES_PER_KEY`` is what it assumes).

Memory is counted three ways: Python's allocations (tracemalloc, numpy's included), Arrow's
pool (``pa.total_allocated_bytes``) and the process's resident set (``/proc/self/statm``).
Results: benchmarks/results/driver_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pyarrow as pa

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "driver_memory.json")
FILE_ROWS = 2_000_000  # an MV file's rows at 100M (merge.TARGET_FILES)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measured(build) -> dict:
    """Bytes held by what ``build`` returns (kept alive until measured)."""
    import gc

    gc.collect()
    rss, arrow = _rss(), pa.total_allocated_bytes()
    tracemalloc.start()
    held = build()
    gc.collect()
    python = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    out = {"python": python, "arrow": pa.total_allocated_bytes() - arrow, "rss": _rss() - rss}
    del held
    return out


def vnode_state(n: int) -> object:
    """The driver's state of ``n`` vnodes, built by the platform's code (module docstring)."""
    from backfill_assets.core import codec
    from backfill_assets.core.keys import KeyColumn, KeyOrder
    from backfill_assets.core.progress import BackfillState, InProgress
    from backfill_assets.mv.owned_tables import txn_id
    from backfill_assets.mv.recovery import progress_schema

    order = KeyOrder((KeyColumn("id", "bigint"),))
    rows = [codec.encode(v, InProgress((v * 1_000_003 + 17,), 400 * v + 1), 12, order)
            for v in range(n)]
    table = pa.Table.from_pylist(rows, schema=progress_schema(order))
    decoded = {vnode: (p, ver) for vnode, p, ver in (codec.decode(r, order) for r in rows)}
    state = BackfillState(order, range(n), decoded)
    txns = {txn_id("orders_mv", phase, v): 12 for phase in ("mv", "replica", "progress")
            for v in range(n)}
    return rows, table, state, txns


def cached_keys(n: int, composite: bool) -> object:
    """A KeyCache holding the keys of ``n`` rows in files of FILE_ROWS."""
    from backfill_assets.storage.rows.key_cache import KeyCache

    cache, rng = KeyCache(limit_bytes=1 << 40), np.random.default_rng(7)
    names = ("region", "id") if composite else ("id",)
    for start in range(0, n, FILE_ROWS):
        ids = rng.permutation(np.arange(start, min(n, start + FILE_ROWS), dtype=np.int64))
        cols = {"id": pa.array(ids)}
        if composite:
            cols = {"region": pa.array(np.char.add("r", (ids % 97).astype(str)).astype(object),
                                       pa.string()), **cols}
        table = pa.table(cols)
        cache.file_keys("mv", f"part-{start}.parquet", 1, len(ids), names, lambda t=table: t)
        del table, cols, ids
    return cache


def child(what: str, n: int) -> dict:
    if what == "vnodes":
        return _measured(lambda: vnode_state(n))
    cache = [None]

    def build():
        cache[0] = cached_keys(n, what == "composite_keys")
        return cache[0]

    out = _measured(build)
    return {**out, "cache_counts": cache[0].bytes}


def _run_child(what: str, n: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.driver_memory", "--child", what,
                           str(n)], capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_unit(what: str, sizes: list[int]) -> dict:
    """Each count at both sizes and their difference per unit (vnode or key)."""
    small, large = (_run_child(what, n) for n in sizes)
    span = sizes[1] - sizes[0]
    return {"sizes": sizes, "small": small, "large": large,
            "bytes_per_unit": {k: round((large[k] - small[k]) / span, 1) for k in large}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vnodes", default="1024,65536")
    p.add_argument("--keys", default="2000000,8000000")
    p.add_argument("--child", nargs=2, metavar=("WHAT", "N"))
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))), flush=True)
        return
    from backfill_assets.storage.rows.key_cache import CACHED_BYTES_PER_KEY

    keys = [int(k) for k in args.keys.split(",")]
    out = {"per_vnode": per_unit("vnodes", [int(v) for v in args.vnodes.split(",")]),
           "per_key_int64": per_unit("int_keys", keys),
           "per_key_string_int64": per_unit("composite_keys", keys),
           "cached_bytes_per_key_assumed": CACHED_BYTES_PER_KEY}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
    for name in ("per_vnode", "per_key_int64", "per_key_string_int64"):
        print(name, out[name]["bytes_per_unit"])


if __name__ == "__main__":
    main()
