"""Which files of a version can hold given rows: pruning by the log's per-file statistics.

Files of the platform's tables are clustered by (vnode, key), so each holds a narrow vnode
range with exact min/max statistics. A file may hold a key when every key column (and the
vnode) lies within that file's bounds; only exact statistics prune (integers, dates, strings
short enough not to be truncated), and a file without them is always kept: a file holding a
key is never missed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.names import VNODE
from backfill_assets.storage.delta.log import DataFile


def files_in_vnodes(files: Sequence[DataFile], vnodes: Iterable[int]) -> list[DataFile]:
    """Files whose vnode bounds meet ``vnodes`` (files without vnode stats are kept)."""
    wanted = sorted({int(v) for v in vnodes})
    out = []
    for f in files:
        lo, hi = vnode_span(f)
        if lo is None or hi is None or _any_between(wanted, lo, hi):
            out.append(f)
    return out


def vnode_stats_from_log(files: Sequence[DataFile], key_name: str, vnodes: Iterable[int]
                         ) -> dict[int, tuple[int, tuple, bool]] | None:
    """Per vnode of ``vnodes``: (rows, last key, False) from the log alone, or None when the
    log cannot say it exactly. Exact for a table whose files hold one vnode each, carry no
    deletion vector (rows = the record counts) and have an exact integer max of the single,
    ascending key column (the last key). The caller vouches that keys are unique and not
    null (the platform writer's): nothing here reads a row."""
    wanted = {int(v) for v in vnodes}
    out: dict[int, tuple[int, tuple, bool]] = {}
    for f in files:
        lo, hi = vnode_span(f)
        if lo is None or lo != hi:
            return None
        if lo not in wanted or f.num_records == 0:
            continue
        top = _bound(f, "max", key_name)
        if f.deletion_vector or f.num_records is None or type(top) is not int:
            return None
        rows, last, _ = out.get(lo, (0, (top,), False))
        out[lo] = (rows + f.num_records, (max(last[0], top),), False)
    return out


def vnode_span(f: DataFile) -> tuple[int | None, int | None]:
    """The vnodes a file's rows lie between: its vnode partition, else its exact stats
    (None where unknown)."""
    part = f.partition_values.get(VNODE)
    if part is not None:
        return int(part), int(part)
    return _bound(f, "min", VNODE), _bound(f, "max", VNODE)


def files_within_vnodes(files: Sequence[DataFile], vnodes: Iterable[int]) -> list[DataFile]:
    """Files all of whose rows are in ``vnodes``' span (what a run may compact alone)."""
    wanted = sorted({int(v) for v in vnodes})
    lo_w, hi_w = (wanted[0], wanted[-1]) if wanted else (0, -1)
    out = []
    for f in files:
        lo, hi = _bound(f, "min", VNODE), _bound(f, "max", VNODE)
        if lo is not None and hi is not None and lo_w <= lo and hi <= hi_w:
            out.append(f)
    return out


def files_holding(files: Sequence[DataFile], keys: pa.Table,
                  key_names: Sequence[str]) -> list[DataFile]:
    """Files that may hold one of ``keys`` (a table of key columns, with ``vnode`` when the
    table is arranged by the same vnodes: its bounds then prune first)."""
    return [f for f, _ in keys_by_file(files, keys, key_names)]


def keys_by_file(files: Sequence[DataFile], keys: pa.Table, key_names: Sequence[str],
                 test_bounds: Callable[[DataFile], bool] | None = None
                 ) -> list[tuple[DataFile, pa.Table]]:
    """``files_holding`` with, per file, the keys it may hold (those in its vnode range when
    ``keys`` has a ``vnode`` column): a lookup in a file then probes only those, so a large
    change set costs each file its own share instead of every key. ``test_bounds``: whether a
    file's key statistics prune it too (default: every file's; a file whose keys a lookup
    already holds in memory is probed faster than its bounds are tested)."""
    if keys.num_rows == 0:
        return []
    if VNODE not in keys.column_names:  # keys of a table arranged otherwise: key bounds only
        return [(f, keys) for f in files if _admits(f, keys, key_names)]
    order = pc.sort_indices(keys, [(VNODE, "ascending")])
    keys = keys.take(order)
    vnodes = keys.column(VNODE).cast(pa.int64()).to_numpy(zero_copy_only=False)
    out = []
    for f in files:
        lo, hi = _bound(f, "min", VNODE), _bound(f, "max", VNODE)
        start = 0 if lo is None else int(vnodes.searchsorted(lo, "left"))
        stop = len(vnodes) if hi is None else int(vnodes.searchsorted(hi, "right"))
        if start >= stop:
            continue
        mine = keys.slice(start, stop - start)
        if (test_bounds is not None and not test_bounds(f)) or _admits(f, mine, key_names):
            out.append((f, mine))
    return out


def _admits(f: DataFile, keys: pa.Table, key_names: Sequence[str]) -> bool:
    hit = None
    for k in key_names:
        for side, test in (("min", pc.greater_equal), ("max", pc.less_equal)):
            bound = _bound(f, side, k)
            if bound is None:
                continue
            col = keys.column(k)
            if isinstance(bound, str) and not pa.types.is_string(col.type):
                continue
            ok = pc.fill_null(test(col, pa.scalar(bound, col.type)), True)
            hit = ok if hit is None else pc.and_(hit, ok)
    return hit is None or pc.any(hit).as_py()


def _bound(f: DataFile, side: str, column: str):
    value = f.stats.get((side, column))
    if value is None:
        return None
    if isinstance(value, str) and len(value) >= 32:
        return None  # possibly a truncated prefix: not an exact bound
    if isinstance(value, dt.datetime):
        return None  # timestamp stats are truncated to milliseconds
    return value if isinstance(value, (int, str, dt.date)) else None


def _any_between(sorted_values: list[int], lo: int, hi: int) -> bool:
    import bisect

    i = bisect.bisect_left(sorted_values, lo)
    return i < len(sorted_values) and sorted_values[i] <= hi
