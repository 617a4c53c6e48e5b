"""Where a key falls among rows: masks for any rows, binary searches for rows in key order.

A chunk task asks the same two questions of every file it reads: which rows sort after the
vnode's position (``rows_after``), and how many sort before the next file's lower bound
(``count_before``). As masks, each costs several Arrow compute calls over the whole file; a
replica's files are in key order, so one vectorised order check (``in_key_order``) lets both
be answered by a binary search (``search``; a single integer pk: numpy's ``searchsorted``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.key_types import INT_RANGES
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.rows.write import in_key_sort_order


def rows_after(rows: pa.Table, key_order: KeyOrder, pos: Key, ordered: bool = False
           ) -> pa.Table:
    """The rows whose key sorts strictly after ``pos``: a slice when ``rows`` are in key
    order (a replica file: a single integer key checked here, else ``ordered``, see
    ``in_key_order``), else a filter."""
    keys = _ordered_keys(rows, key_order)
    if keys is not None:
        return rows.slice(int(np.searchsorted(keys, _signed(key_order, pos), "right")))
    if ordered:
        return rows.slice(search(rows, key_order, pos, after=True))
    return rows.filter(after(rows, key_order, pos))


def count_before(rows: pa.Table, key_order: KeyOrder, cut: Key, ordered: bool = False) -> int:
    """How many of ``rows`` sort strictly before ``cut`` (``ordered``: as in ``rows_after``)."""
    keys = _ordered_keys(rows, key_order)
    if keys is not None:
        return int(np.searchsorted(keys, _signed(key_order, cut), "left"))
    if ordered:
        return search(rows, key_order, cut, after=False)
    mask = pc.invert(pc.or_kleene(after(rows, key_order, cut), _equal(rows, key_order, cut)))
    return pc.sum(pc.fill_null(mask, False).cast(pa.int64())).as_py() or 0


# pk types whose Python values (``as_py``) order as Arrow sorts them: integers, and strings
# (UTF-8 bytes order as code points do); other types keep the masks
_SEARCHABLE = frozenset({*INT_RANGES, "string"})


def searchable(rows: pa.Table, key_order: KeyOrder) -> bool:
    """Pk columns of searchable types, and no null among them (a null pk is masked: the
    masks drop it, as the SQL of ``KeyOrder.sql_after`` does)."""
    return all(c.type in _SEARCHABLE and not rows.column(c.name).null_count
               for c in key_order.columns)


def in_key_order(rows: pa.Table, key_order: KeyOrder) -> bool:
    """Whether ``rows`` may be binary-searched by ``search``: pk columns of searchable types,
    no null, in key order (ties allowed: a repeated pk is still counted right). One check of
    a few vectorised compares, instead of the masks of every ``after``/``count_before`` on it (a
    composite pk's chunk task spent a third of its time in them)."""
    if not rows.num_rows or not searchable(rows, key_order):
        return False
    if len(key_order.columns) == 1 and key_order.columns[0].type in INT_RANGES:
        return False  # ``_ordered_keys`` checks and searches it in numpy
    return in_key_sort_order(rows, [(c.name, "descending" if c.descending else "ascending")
                                    for c in key_order.columns])


def search(rows: pa.Table, key_order: KeyOrder, key: Key, *, after: bool) -> int:
    """In ``rows`` in key order (``in_key_order``): how many sort before ``key`` (at or
    before it, ``after``), by a binary search of Python compares."""
    columns = [rows.column(c.name) for c in key_order.columns]
    lo, hi = 0, rows.num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        c = key_order.compare(tuple(col[mid].as_py() for col in columns), key)
        if c < 0 or (after and c == 0):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _ordered_keys(rows: pa.Table, key_order: KeyOrder) -> np.ndarray | None:
    """A single integer key as numpy, ascending in key order (negated when descending),
    when every row has one and they are strictly increasing; else None (use masks)."""
    if len(key_order.columns) != 1 or not rows.num_rows:
        return None
    column = rows.column(key_order.columns[0].name)
    if not (pa.types.is_signed_integer(column.type) or column.type in (
            pa.uint8(), pa.uint16(), pa.uint32())) or column.null_count:
        return None
    keys = column.to_numpy().astype(np.int64, copy=False)
    if key_order.columns[0].descending:
        keys = -keys
    return keys if bool(np.all(keys[1:] > keys[:-1])) else None


def _signed(key_order: KeyOrder, key: Key) -> int:
    return -int(key[0]) if key_order.columns[0].descending else int(key[0])


def _equal(table: pa.Table, key_order: KeyOrder, key: Key) -> pa.ChunkedArray:
    """Mask: the row's key equals ``key``."""
    expr = None
    for col, value in zip(key_order.columns, key, strict=True):
        column = table.column(col.name)
        eq = pc.equal(column, pa.scalar(value, column.type))
        expr = eq if expr is None else pc.and_kleene(expr, eq)
    return expr


def after(table: pa.Table, key_order: KeyOrder, pos: Key) -> pa.ChunkedArray:
    """Mask: the row's key sorts strictly after ``pos`` (null keys: null, i.e. dropped, as in
    the SQL of ``KeyOrder.sql_after``)."""
    expr = None
    for col, value in reversed(list(zip(key_order.columns, pos, strict=True))):
        column = table.column(col.name)
        scalar = pa.scalar(value, column.type)
        beyond = (pc.less if col.descending else pc.greater)(column, scalar)
        expr = beyond if expr is None else pc.or_kleene(
            beyond, pc.and_kleene(pc.equal(column, scalar), expr))
    return expr


def within(table: pa.Table, key_order: KeyOrder, pos: Key | None, top: Key | None) -> pa.Table:
    """The rows whose key lies in (``pos``, ``top``] (None: unbounded on that side): one mask,
    one filter (a filter copies every column, and whole rows are most of a file)."""
    masks = ([] if pos is None else [after(table, key_order, pos)]) + \
        ([] if top is None else [pc.invert(after(table, key_order, top))])
    if not masks or not table.num_rows:
        return table
    return table.filter(masks[0] if len(masks) == 1 else pc.and_kleene(*masks))


def key_at(rows: pa.Table, i: int, key_order: KeyOrder) -> Key:
    """Row ``i``'s key, as Python values."""
    return tuple(rows.column(c)[i].as_py() for c in key_order.names)
