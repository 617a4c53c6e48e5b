"""The statistics a writer records for files cut from one run equal those of each file alone.

The replica's copy cuts each vnode's rows into files of one chunk and computes their min/max
and null counts in one hash aggregation per vnode (``write._Stats.of_slices``), not ten
``min_max`` calls per file. The log's statistics decide which files a seek or a key lookup
reads, so they must be exactly what a file-by-file count gives: generated columns of every
kind the stats cover (integers, floats with NaN, dates, strings with non-ASCII) and some they
do not (booleans, lists: null counts only), nulls anywhere, any slice size. Pure Arrow.
"""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.storage.rows.write import _Stats

_ROW = st.fixed_dictionaries({
    "s": st.none() | st.text(alphabet="az\u00fc\u4e2d", max_size=4),
    "i": st.none() | st.integers(-(2**63), 2**63 - 1),
    "f": st.none() | st.floats(allow_nan=True, allow_infinity=True),
    "d": st.none() | st.integers(0, 30000),
    "b": st.none() | st.booleans(),
    "l": st.none() | st.lists(st.integers(0, 3), max_size=2),
})
_SCHEMA = pa.schema([("s", pa.string()), ("i", pa.int64()), ("f", pa.float64()),
                     ("d", pa.date32()), ("b", pa.bool_()), ("l", pa.list_(pa.int64()))])


def _table(rows: list[dict]) -> pa.Table:
    cols = {name: [r[name] for r in rows] for name in _SCHEMA.names}
    cols["d"] = pa.array(cols["d"], pa.int32()).cast(pa.date32())
    return pa.table(cols, schema=_SCHEMA)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROW, max_size=60), st.integers(1, 25))
def test_stats_of_slices_equal_each_slice_counted_alone(rows, size):
    table = _table(rows)
    got = _Stats.of_slices(table, _SCHEMA, size)
    assert got is not None and len(got) == max(1, math.ceil(table.num_rows / size))
    for i, stats in enumerate(got):
        alone = _Stats(_SCHEMA)
        part = table.slice(i * size, size)
        if part.num_rows:
            alone.add(part)
        assert stats.json(part.num_rows) == alone.json(part.num_rows)
