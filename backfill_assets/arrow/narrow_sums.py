"""A batch's running sums added as int64 units when no group's sum can leave int64.

Why: the group state keeps an exact sum as decimal(38, s), and adding decimal128 in Arrow
wraps silently past 38 digits, so the general path adds decimal256 (aggregate_state.py). A
0.1% barrier of the aggregate benchmark adds ~30k signed rows into ~25k groups: the casts to
decimal256, the signed negation and the decimal256 hash sums were most of the state update.
Sums of prices and quantities fit int64 by far, so the same sums run over int64 units (the
unscaled integers), exactly, whenever a bound proves that no group's sum, and no partial sum
on the way, leaves int64: every group's old sum has at most the largest old magnitude, and a
batch of n rows adds at most n times the largest change magnitude. Any batch past the bound
(or a value beyond int64, or an input whose scale is not the sum's) returns None, and the
caller takes the decimal256 path, so the result is the same either way
(`tests/test_arrow_narrow_sums.py` holds the two equal, the bound's edges included).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.running_avg import decimal_array, int64_units

_INT64_MAX = (1 << 63) - 1


def units_of(column: pa.Array | pa.ChunkedArray, scale: int) -> np.ndarray | None:
    """The int64 units of an integer column (scale 0) or a decimal128 column at ``scale``
    (nulls as 0), or None when they are not int64 units at that scale."""
    t = column.type
    if pa.types.is_integer(t) and scale == 0:
        filled = pc.fill_null(column, 0)
        return np.asarray(pc.cast(filled, pa.int64()).to_numpy(zero_copy_only=False),
                          dtype=np.int64)
    if pa.types.is_decimal128(t) and t.scale == scale:
        return int64_units(column)
    return None


def signed_units(olds: Sequence[pa.ChunkedArray | pa.Array],
                 values: Sequence[pa.ChunkedArray | pa.Array], signs: np.ndarray,
                 scales: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """Per running sum: the old state sums' units and the changes' signed units, when every
    group's sum after adding them, in any order, stays inside int64; else None."""
    old_units, change_units = [], []
    for old, value, scale in zip(olds, values, scales, strict=True):
        before, delta = units_of(old, scale), units_of(value, scale)
        if before is None or delta is None or _has_min(before) or _has_min(delta):
            return None
        top_old = int(np.abs(before).max()) if len(before) else 0
        top_delta = int(np.abs(delta).max()) if len(delta) else 0
        if top_old + len(delta) * top_delta > _INT64_MAX:  # Python ints: no wrap here
            return None
        old_units.append(before)
        change_units.append(delta * signs)
    return old_units, change_units


def _has_min(units: np.ndarray) -> bool:
    """Whether int64's lowest value is there (its magnitude is not an int64)."""
    return bool(len(units)) and bool((units == np.iinfo(np.int64).min).any())


def as_decimal(units: pa.ChunkedArray | pa.Array, type_: pa.Decimal128Type) -> pa.Array:
    """int64 units (no nulls) as a decimal128 column of ``type_``."""
    array = units.combine_chunks() if isinstance(units, pa.ChunkedArray) else units
    values = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)
    return decimal_array(values, np.ones(len(values), dtype=bool), type_)
