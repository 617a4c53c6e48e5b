"""Keys as one int64 each, ordered as the keys are: how the driver sorts, folds and searches
composite keys at numpy speed.

An Arrow sort of composite keys (say (region, id)) compares them column by column, row by
row; numpy's partition of packed ranks makes the same selection on one int64 per key. A ``KeySpace``
is built from one table of keys: an integer, date or timestamp column packs as its offset from
the smallest value, a string or decimal column as the dense rank of its value among the
distinct values, columns in turn, each in its direction. Ranks compare keys of that space only;
``encode`` places other keys in it, and says which it cannot place (a value the space never saw
has no rank, so a key holding one is not a key of the table the space was built from).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.keys import KeyOrder

_INTEGER_LIKE = (pa.types.is_integer, pa.types.is_date, pa.types.is_timestamp)
_BITS = 62


@dataclass(frozen=True)
class _Column:
    name: str
    descending: bool
    low: int | None  # integer-like: the smallest value; else None
    distinct: pa.Array | None  # others: the distinct values, sorted
    width: int  # the largest code
    shift: int  # bits the code takes


@dataclass(frozen=True)
class KeySpace:
    """The rank space of one table of keys (``of``): ``encode`` ranks keys in it."""

    columns: tuple[_Column, ...]

    @classmethod
    def of(cls, keys: pa.Table, key_order: KeyOrder) -> KeySpace | None:
        """The space of ``keys``, or None when a key is null or the ranks do not fit 62 bits."""
        columns, bits = [], 0
        for c in key_order.columns:
            column = keys.column(c.name)
            if column.null_count:
                return None
            if _integer_like(column.type):
                values = _as_int64(column)
                low = int(values.min()) if len(values) else 0
                width, distinct = (int(values.max()) - low) if len(values) else 0, None
                if width.bit_length() > _BITS:
                    return None
            else:
                distinct = pc.unique(column)
                distinct, low = distinct.take(pc.sort_indices(distinct)), None
                width = len(distinct) - 1
            shift = max(1, width.bit_length())
            bits += shift
            if bits > _BITS:
                return None
            columns.append(_Column(c.name, c.descending, low, distinct, width, shift))
        return cls(tuple(columns))

    def encode(self, keys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(ranks, inside): each row's rank in this space, and whether it has one (a value
        outside the space's range or set: then its rank is 0 and means nothing)."""
        packed = np.zeros(keys.num_rows, np.int64)
        inside = np.ones(keys.num_rows, bool)
        for c in self.columns:
            column = keys.column(c.name)
            if c.low is not None:
                values = _as_int64(column)
                valid = (values >= c.low) & (values <= c.low + c.width)
                codes = values - c.low  # masked below where it is not valid
            else:
                found = pc.index_in(column, value_set=c.distinct)
                valid = found.is_valid().to_numpy(zero_copy_only=False)
                codes = pc.fill_null(found, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            if column.null_count:
                valid &= column.is_valid().to_numpy(zero_copy_only=False)
            codes = np.where(valid, codes, 0)
            if c.descending:
                codes = c.width - codes
            inside &= valid
            packed = (packed << c.shift) | codes
        return np.where(inside, packed, 0), inside


def packed_ranks(keys: pa.Table, key_order: KeyOrder) -> np.ndarray | None:
    """One int64 per row that orders the rows as their keys do, relative to ``keys`` (they
    compare rows of this table only, which is all a fold or a sort needs), or None when a key
    is null or they do not fit 62 bits."""
    space = KeySpace.of(keys, key_order)
    return None if space is None else space.encode(keys)[0]


def kth_smallest(ranks: np.ndarray, k: int) -> tuple[int, int]:
    """The ``k``-th smallest of ``ranks`` (1-based) and the index of a row holding it: a
    partition, linear in the rows."""
    kth = int(np.partition(ranks, k - 1)[k - 1])
    return kth, int(np.flatnonzero(ranks == kth)[0])


def _integer_like(t: pa.DataType) -> bool:
    return any(test(t) for test in _INTEGER_LIKE)


def _as_int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if pa.types.is_date32(column.type):  # no direct cast to int64
        column = column.cast(pa.int32())
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)
