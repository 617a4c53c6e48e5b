"""Rows a task reads already in (vnode, key) order: the file order that makes them so, and the
check that lets the task skip its sort.

Why: a bulk task (``writes/bulk.py``) sorts every row it read by (vnode, key), a
``sort_indices`` and a ``take`` of every column. A vnode's files are often each in key order
and key-range disjoint (the platform writer appends one key range per vnode and commit), but
the log lists them newest first, so their concatenation is not in order. Read in the order of
their first key column's lower bound (``by_lower_key``), they concatenate sorted; one
vectorised pass (``in_sort_order``) then proves it. The file order is only a guess from the
log (files without stats, overlapping ranges, a composite key tied on its first column, a
null key, a deletion vector: any of them may leave the rows out of order): the check decides,
and rows it does not pass are sorted as before, so the result is the sort's in every case.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.keys import KeyOrder
from backfill_assets.storage.delta.log import DataFile

SortKeys = Sequence[tuple[str, str, str]]  # pc.sort_indices' (column, order, null placement)


def by_lower_key(files: Sequence[DataFile], key_order: KeyOrder) -> list[DataFile]:
    """``files`` in the order of their first key column's bound in key order (its min when
    ascending, its max descending; ties by the other end), then those the log gives no such
    bound, in their own order: sorted, disjoint files read in turn concatenate sorted."""
    first = key_order.columns[0]
    near, far = ("max", "min") if first.descending else ("min", "max")
    known, unknown = [], []
    for f in files:
        low = f.stats.get((near, first.name))
        if low is None:
            unknown.append(f)
        else:
            high = f.stats.get((far, first.name))
            known.append(((low, low if high is None else high), f))
    known.sort(key=lambda entry: entry[0], reverse=first.descending)
    return [f for _, f in known] + unknown


def in_sort_order(table: pa.Table, order: SortKeys) -> bool:
    """Whether ``table``'s rows are strictly increasing in ``order`` (the sort keys of
    ``pc.sort_indices``, nulls "at_end"): every pair of neighbours told apart by its first
    differing column, and that column the right way. A null sorts after every value in either
    direction and ties with a null, as the sort places them. Strict, so the sort would leave
    the rows as they are whatever its tie order; O(rows), a few Arrow kernels per column."""
    n = table.num_rows
    if n < 2:
        return True
    settled = None  # the pairs an earlier column already orders
    for name, direction, nulls in order:
        if nulls != "at_end":
            raise ValueError(f"null placement {nulls!r}: only 'at_end' is checked")
        column = table.column(name)
        a, b = column.slice(0, n - 1), column.slice(1)
        wrong = (pc.less if direction == "descending" else pc.greater)(a, b)
        differs = pc.not_equal(a, b)
        if column.null_count:
            a_null, b_null = pc.is_null(a), pc.is_null(b)
            wrong = pc.or_(pc.fill_null(wrong, False), pc.and_not(a_null, b_null))
            differs = pc.or_(pc.fill_null(differs, False), pc.xor(a_null, b_null))
        if settled is not None:
            wrong = pc.and_not(wrong, settled)
        if pc.any(wrong).as_py():
            return False
        settled = differs if settled is None else pc.or_(settled, differs)
        if pc.all(settled).as_py():
            return True
    return False


def sorted_rows(table: pa.Table, order: SortKeys) -> pa.Table:
    """``table`` sorted by ``order``: itself when ``in_sort_order`` already, else by
    ``pc.sort_indices`` and a ``take`` (most of the cost: it copies every column)."""
    if in_sort_order(table, order):
        return table
    return table.take(pc.sort_indices(table, order))
