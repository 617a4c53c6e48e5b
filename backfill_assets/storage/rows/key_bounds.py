"""A written file's first and last key in a key order, and whether rows are in that order.

Why apart from the writer (rows/write.py): a composite key's seek (chunks/key_search.py)
needs the exact first and last key of each file, which Parquet statistics (per column, and
inexact past a string length) cannot give; the writer records them as an add action's tag.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _key_bounds(keys: list[pa.Table], key_sort: list[tuple[str, str]],
                ordered: bool = False) -> list | None:
    """The file's first and last key in ``key_sort`` order, when every key is present and
    JSON says it exactly (ints, strings, bools); else None (the seek then uses the stats).
    Rows that came in key order (checked here, or by the caller: ``ordered``) give them as
    their first and last rows."""
    if not keys or not key_sort:
        return None
    table = pa.concat_tables(keys)
    n = table.num_rows
    if not n or any(c.null_count for c in table.columns) or not all(
            pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_boolean(t)
            for t in table.schema.types):
        return None
    if ordered or in_key_sort_order(table, key_sort):
        ends = [0, n - 1]
    else:
        order = pc.sort_indices(table, sort_keys=[(k, d, "at_end") for k, d in key_sort])
        ends = [order[0].as_py(), order[-1].as_py()]
    rows = table.take(pa.array(ends)).to_pylist()
    return [[row[k] for k, _ in key_sort] for row in rows]


def in_key_sort_order(table: pa.Table, key_sort: list[tuple[str, str]]) -> bool:
    """Whether the rows are in ``key_sort`` order (lexicographic, ties allowed)."""
    n = table.num_rows
    if n < 2:
        return True
    settled = pa.array(np.zeros(n - 1, bool))  # an earlier column already orders the pair
    for name, direction in key_sort:
        a, b = table.column(name).slice(0, n - 1), table.column(name).slice(1)
        wrong = pc.greater(a, b) if direction == "ascending" else pc.less(a, b)
        if pc.any(pc.and_(pc.invert(settled), wrong)).as_py():
            return False
        settled = pc.or_(settled, pc.not_equal(a, b))
    return True
