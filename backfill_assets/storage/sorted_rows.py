"""A vnode's chunk from rows that arrive in key order: binary searches and a merge, no sort.

Why. A per-vnode chunk read (``chunk_task``) reads a replica's one-vnode, key-sorted files in
key order, and a barrier's change rows are a few per vnode. Profiled at 5M rows with the
composite key (py-spy over the Spark workers, docs/BENCHMARKS.md round 13), a chunk task spent
most of its time on work over every row read: the hash join that finds the base rows a change
names (19%), the sort of everything read by (vnode, key) (17%) and the position's mask filters
(16%). Here the position and a cut are found by binary search, the base rows a change names by
one binary search per change row, and the resolved change rows are merged in at their
insertion points: the rows read are only sliced and taken once.

When. Only over rows that are strictly increasing in key order with no null key (checked by a
vectorised comparison of neighbours, much cheaper than a sort), and for key types whose Python
order is Arrow's (integers, strings, dates). Anything else (a file written by another path, a
key the upstream holds twice, a float key) returns None and the caller takes the general path:
the result is the same, only slower.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core import names
from backfill_assets.core.keys import Key, KeyOrder

VNODE = names.VNODE


def _orderable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_date(t))


class SortedRows:
    """Rows strictly increasing in ``key_order`` (``of`` checks it), searchable by key."""

    def __init__(self, rows: pa.Table, key_order: KeyOrder, ints: np.ndarray | None):
        self.rows, self.key_order, self._ints = rows, key_order, ints
        self._columns = [rows.column(c.name) for c in key_order.columns]

    @classmethod
    def of(cls, rows: pa.Table, key_order: KeyOrder) -> SortedRows | None:
        """``rows`` as SortedRows, or None when they are not strictly increasing in key order
        with no null key, or a key type is not one whose Python order is Arrow's."""
        columns = [rows.column(c.name) for c in key_order.columns]
        if not all(_orderable(c.type) for c in columns) or any(c.null_count for c in columns):
            return None
        n = rows.num_rows
        if len(columns) == 1 and pa.types.is_integer(columns[0].type) and \
                columns[0].type != pa.uint64():
            keys = columns[0].to_numpy().astype(np.int64, copy=False)
            if key_order.columns[0].descending:
                keys = -keys
            return cls(rows, key_order, keys) if bool(np.all(keys[1:] > keys[:-1])) else None
        return cls(rows, key_order, None) if n < 2 or _strictly_increasing(
            columns, key_order) else None

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    def key(self, i: int) -> Key:
        return tuple(c[i].as_py() for c in self._columns)

    def bisect(self, key: Key, right: bool) -> int:
        """The first row after ``key`` (``right``) or at or after it (not ``right``)."""
        if self._ints is not None:
            signed = -int(key[0]) if self.key_order.columns[0].descending else int(key[0])
            return int(np.searchsorted(self._ints, signed, "right" if right else "left"))
        lo, hi = 0, self.num_rows
        while lo < hi:
            mid = (lo + hi) // 2
            c = self.key_order.compare(self.key(mid), key)
            if c < 0 or (right and c == 0):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def after(self, key: Key) -> SortedRows:
        """The rows whose key sorts strictly after ``key``."""
        start = self.bisect(key, right=True)
        return SortedRows(self.rows.slice(start), self.key_order,
                          None if self._ints is None else self._ints[start:])

    @classmethod
    def concat(cls, pieces: Sequence[SortedRows], key_order: KeyOrder, schema: pa.Schema
               ) -> SortedRows | None:
        """Sorted pieces one after the other, or None when a piece's first key does not sort
        after the previous piece's last (files that overlap: the general path sorts)."""
        pieces = [p for p in pieces if p.num_rows]
        for a, b in zip(pieces, pieces[1:], strict=False):
            if key_order.compare(a.key(a.num_rows - 1), b.key(0)) >= 0:
                return None
        rows = pa.concat_tables([p.rows for p in pieces]) if pieces else schema.empty_table()
        ints = None
        if pieces and all(p._ints is not None for p in pieces):
            ints = np.concatenate([p._ints for p in pieces])
        elif not pieces and len(key_order.columns) == 1:
            ints = np.zeros(0, np.int64) if pa.types.is_integer(
                schema.field(key_order.columns[0].name).type) else None
        return cls(rows, key_order, ints)

    def before(self, key: Key) -> int:
        """How many rows sort strictly before ``key``."""
        return self.bisect(key, right=False)

    def find(self, key: Key) -> int | None:
        """The index of the row whose key is ``key``, if any."""
        i = self.bisect(key, right=False)
        return i if i < self.num_rows and self.key_order.compare(self.key(i), key) == 0 else None


def _strictly_increasing(columns: Sequence[pa.ChunkedArray], key_order: KeyOrder) -> bool:
    """Each row's key sorts strictly after the previous row's (lexicographic, per column
    direction), by comparing neighbours column by column from the last."""
    n = len(columns[0])
    result = None
    for col, column in zip(reversed(key_order.columns), reversed(columns), strict=True):
        prev, nxt = column.slice(0, n - 1), column.slice(1)
        beyond = (pc.less if col.descending else pc.greater)(nxt, prev)
        result = beyond if result is None else pc.or_(
            beyond, pc.and_(pc.equal(nxt, prev), result))
    return bool(pc.all(result).as_py())


def merge_changes(rows: SortedRows, changes: pa.Table, pos: Key | None,
                  resolve: Callable[[pa.Table, KeyOrder], pa.Table]) -> pa.Table | None:
    """One vnode's ``rows`` (sorted, all after ``pos``) with its replica ``changes`` applied:
    the rows a change names are resolved with it (``resolve``: storage/replica.py, newest
    version per key, tombstones dropped), the results after ``pos`` merged in at their places.
    None when a change row has a null key (the general path flags it)."""
    if not changes.num_rows:
        return rows.rows
    key_order = rows.key_order
    named = [tuple(r.values()) for r in changes.select(list(key_order.names)).to_pylist()]
    if any(None in key for key in named):
        return None  # a null key from the change feed: the general path refuses it
    touched = sorted({i for key in named if (i := rows.find(key)) is not None})
    resolved = resolve(pa.concat_tables([rows.rows.take(pa.array(touched, pa.int64())),
                                         changes.cast(rows.rows.schema)]), key_order)
    keys = [tuple(r.values()) for r in resolved.select(list(key_order.names)).to_pylist()]
    if pos is not None:
        keep = [key_order.compare(k, pos) > 0 for k in keys]
        resolved = resolved.filter(pa.array(keep, pa.bool_()))
        keys = [k for k, kept in zip(keys, keep, strict=True) if kept]
    mask = np.ones(rows.num_rows, bool)
    mask[touched] = False
    kept = SortedRows(rows.rows.filter(pa.array(mask)), key_order,
                      None if rows._ints is None else rows._ints[mask])
    if not resolved.num_rows:
        return kept.rows
    places = [kept.bisect(key, right=False) for key in keys]
    n = kept.num_rows
    order = np.insert(np.arange(n, dtype=np.int64), places,
                      np.arange(n, n + resolved.num_rows, dtype=np.int64))
    return pa.concat_tables([kept.rows, resolved]).take(pa.array(order))
