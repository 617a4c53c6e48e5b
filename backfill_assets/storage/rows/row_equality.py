"""Which of a small barrier's keyed changes leave the MV's row exactly as it is.

An upsert equal to the row the MV holds for its key changes nothing: the driver engine
(`keyed.locate`) drops it from both sides before it sets a DV bit, writes a row or a
change-data row for it. Equality is Python's on the rows' values (nulls equal, NaN not equal
to NaN), computed column by column in Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core import names

_SIDE = names.INTERNAL_PREFIX + "side"


def unchanged_dropped(before: pa.Table, after: pa.Table, key_names: Sequence[str]
                       ) -> tuple[pa.Table, pa.Table]:
    """Both sides without the keys whose row stays exactly as it is (an upsert equal to the
    held row changes nothing: no DV bit, no new row, no change-data row). Rows compare as
    Python values do, nulls equal (any column type; only the keys on both sides are
    compared), column by column in Arrow (`same_rows`)."""
    if not before.num_rows or not after.num_rows:
        return before, after
    b_idx, a_idx = _pairs(before, after, list(key_names))
    if not len(b_idx):
        return before, after
    same = same_rows(before.take(b_idx), after.take(a_idx))
    if not same.any():
        return before, after
    return (_dropped(before, b_idx.to_numpy()[same]), _dropped(after, a_idx.to_numpy()[same]))


def _pairs(before: pa.Table, after: pa.Table, keys: list[str]) -> tuple[pa.Array, pa.Array]:
    """The row positions of the keys on both sides, ``before``'s and ``after``'s, pair by
    pair. One key column (an aggregate's group text) by a set lookup: each key is on a side
    at most once, and a join plan costs several times the lookup; a null key matches
    nothing, as in the join."""
    if len(keys) == 1:
        at = pc.index_in(after.column(keys[0]),
                         value_set=before.column(keys[0]).combine_chunks(), skip_nulls=True)
        found = pc.is_valid(at)
        a_idx = pa.array(np.flatnonzero(found.to_numpy(zero_copy_only=False)))
        return pc.cast(at.filter(found), pa.int64()).combine_chunks(), a_idx
    pairs = _indexed(before, keys, "b").join(_indexed(after, keys, "a"), keys,
                                             join_type="inner", use_threads=False)
    return (pairs.column(_SIDE + "b").combine_chunks(),
            pairs.column(_SIDE + "a").combine_chunks())


def same_rows(old: pa.Table, new: pa.Table) -> np.ndarray:
    """Per row pair, whether every column is equal as Python compares values (both null is
    equal; NaN is not equal to NaN): Arrow's ``equal`` where the type has it, the Python
    values of the column otherwise (nested types): column at a time in Arrow, not a Python
    comparison of every row."""
    same = np.ones(old.num_rows, dtype=bool)
    for name in old.column_names:
        x, y = old.column(name), new.column(name)
        try:
            equal = pc.fill_null(pc.equal(x, y), False)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            same &= np.array([a == b for a, b in zip(x.to_pylist(), y.to_pylist(),
                                                     strict=True)], dtype=bool)
            continue
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= pc.or_(equal, both_null).to_numpy(zero_copy_only=False)
    return same


def _indexed(t: pa.Table, keys: list[str], side: str) -> pa.Table:
    return t.select(keys).append_column(_SIDE + side, pa.array(np.arange(t.num_rows)))


def _dropped(t: pa.Table, rows: np.ndarray) -> pa.Table:
    keep = np.ones(t.num_rows, dtype=bool)
    keep[rows] = False
    return t.filter(pa.array(keep))
