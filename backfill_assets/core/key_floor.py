"""The least key a file can hold after a position: a floor, from the file's bounds alone.

A no_shuffle chunk reads the upstream's own files, which need not be clustered by the key. A
composite key's per-column min/max bound a *box*, and the box's lower corner is a poor bound
once the position has moved past it: over files that each hold every value of a leading
column (a region, a tenant) and a narrow range of the next (an id, ingested in order), every
file's corner is (first region, low id), so every file looked as if it held the next chunk.
The position sharpens it. With the position at (eu, 5M), a file of ids [6M, 8M] holds nothing
after it before (eu, 6M), and a file of ids [0, 2M] nothing before the region after eu. Files
taken in the order of their floor can stop as soon as the rows read hold the chunk before the
next floor (storage/chunks/shared_cut.py): the rest cannot hold a key at or before the cut.

A floor is a prefix of a key, closed or open: closed admits the keys whose first
``len(prefix)`` values sort at or after it, open those that sort strictly after it. The empty
closed prefix admits every key: a file without usable bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backfill_assets.core.keys import Key, KeyOrder, _compare_values


@dataclass(frozen=True)
class Floor:
    """Every key the file holds after the position is admitted by this prefix (module doc)."""

    prefix: tuple
    open: bool = False


ANY = Floor(())  # no usable bound: the file may hold any key


def floor_after(order: KeyOrder, low: Sequence[object | None], high: Sequence[object | None],
                pos: Key | None, first: Key | None = None) -> Floor | None:
    """The floor of the keys in the box ``low``..``high`` (per pk column, in key order: a
    descending column's ``low`` is its max; None: unbounded on that side) that sort after
    ``pos`` (None: from the start); None when the box holds no such key. ``first``: the
    file's exact first key when its writer recorded it, which sharpens the floor."""
    floor = _box_floor(order, low, high, pos, 0)
    if floor is None or first is None:
        return floor
    exact = Floor(tuple(first)) if pos is None or order.compare(first, pos) > 0 \
        else Floor(tuple(pos), open=True)
    return exact if compare_floors(order, exact, floor) > 0 else floor


def _box_floor(order: KeyOrder, low, high, pos: Key | None, i: int) -> Floor | None:
    """The floor among keys that equal ``pos`` on columns before ``i`` (module doc)."""
    n = len(order.columns)
    if pos is None or i == n:
        if pos is not None:  # equal to the position on every column: not after it
            return None
        return Floor(_closed(low, 0))
    col, p = order.columns[i], pos[i]
    if low[i] is not None and _compare_values(col, p, low[i]) < 0:
        return Floor(tuple(pos[:i]) + _closed(low, i))  # column i past p everywhere
    if high[i] is not None and _compare_values(col, p, high[i]) > 0:
        return None  # column i before p everywhere
    inner = _box_floor(order, low, high, pos, i + 1)
    if inner is not None:
        return inner
    if high[i] is not None and _compare_values(col, p, high[i]) == 0:
        return None  # column i cannot pass p, and equal to p nothing is after it
    return Floor(tuple(pos[:i + 1]), open=True)


def _closed(low, i: int) -> tuple:
    """The box's lower corner from column ``i``, up to its first unbounded column."""
    out = []
    for value in low[i:]:
        if value is None:
            break
        out.append(value)
    return tuple(out)


def compare_floors(order: KeyOrder, a: Floor, b: Floor) -> int:
    """-1, 0 or 1 as the least key ``a`` admits sorts before, with or after ``b``'s."""
    for col, x, y in zip(order.columns, a.prefix, b.prefix, strict=False):
        c = _compare_values(col, x, y)
        if c:
            return c
    la, lb = len(a.prefix), len(b.prefix)
    if la == lb:
        return (a.open > b.open) - (a.open < b.open)
    if la < lb:  # a stops first: closed is below anything longer, open above it
        return 1 if a.open else -1
    return -1 if b.open else 1


def admits_at_or_before(order: KeyOrder, floor: Floor, key: Key) -> bool:
    """True when the floor admits a key at or before ``key`` (the file may hold one)."""
    c = _compare_prefix(order, key, floor.prefix)
    return c > 0 or (c == 0 and not floor.open)


def _compare_prefix(order: KeyOrder, key: Key, prefix: tuple) -> int:
    for col, x, y in zip(order.columns, key, prefix, strict=False):
        c = _compare_values(col, x, y)
        if c:
            return c
    return 0
