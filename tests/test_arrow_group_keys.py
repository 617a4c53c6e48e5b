"""An aggregate's group keys a column at a time (arrow/group_keys.py) against the row-at-a-time
reference they replace (core/vnode.py `canonical_value_text`, json.dumps,
core/aggregates.py `group_vnode`), over random group columns of every vectorised type with
nulls, quotes, backslashes and non-ASCII text; what they do not prove falls back (None).
And a decimal column's unscaled integers (arrow/types.py `decimal_units`), which the MV's
finish reads instead of a Decimal per value."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.group_keys import (
    canonical_texts,
    group_vnodes,
    json_lists,
    text_vnodes,
)
from backfill_assets.arrow.types import decimal_units
from backfill_assets.core.aggregates import group_vnode, unscaled
from backfill_assets.core.vnode import canonical_value_text

_TEXT = st.text(alphabet=['a', 'é', '"', '\\', '/', ' ', '日', '\u2028', "'", '\x7f',
                          '\U0001F600'], max_size=4)
_COLUMNS = {
    "string": (pa.string(), _TEXT),
    "bigint": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "int": (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "date": (pa.date32(), st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31))),
}


@st.composite
def _groups(draw):
    types = draw(st.lists(st.sampled_from(sorted(_COLUMNS)), min_size=1, max_size=3))
    n = draw(st.integers(0, 30))
    columns = [draw(st.lists(st.none() | _COLUMNS[t][1], min_size=n, max_size=n))
               for t in types]
    return types, columns, n


@settings(max_examples=150, deadline=None)
@given(_groups())
def test_keys_and_vnodes_are_the_row_at_a_time_ones(groups):
    types, columns, n = groups
    texts = [canonical_texts(pa.array(c, _COLUMNS[t][0]), t)
             for t, c in zip(types, columns, strict=True)]
    assert all(t is not None for t in texts)
    rows = list(zip(*columns, strict=True))
    want = [json.dumps([None if v is None else canonical_value_text(v, t)
                        for v, t in zip(row, types, strict=True)], ensure_ascii=False)
            for row in rows]
    got = json_lists(texts, n)
    assert got is not None and got.to_pylist() == want
    assert text_vnodes(texts, n, 256).to_pylist() == [group_vnode(r, types, 256) for r in rows]


def test_what_is_not_proven_falls_back():
    assert json_lists([pa.array(["a\nb"])], 1) is None  # JSON escapes control characters
    assert canonical_texts(pa.array([dt.date(999, 1, 1)]), "date") is None  # three-digit year
    assert canonical_texts(pa.array([1.5]), "double") is None


def test_a_type_without_a_column_form_hashes_a_row_at_a_time():
    money = pa.array([Decimal("1.50"), None, Decimal("-0.01")], pa.decimal128(10, 2))
    days = pa.array([dt.date(999, 1, 1), dt.date(2024, 2, 29), None], pa.date32())
    types = ["decimal(10,2)", "date"]
    rows = list(zip(money.to_pylist(), days.to_pylist(), strict=True))
    assert group_vnodes([money, days], types, 64).to_pylist() == [
        group_vnode(r, types, 64) for r in rows]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.decimals(-10**36 + 1, 10**36 - 1, places=2, allow_nan=False), max_size=20),
       st.integers(0, 3))
def test_decimal_units_are_the_exact_unscaled_integers(values, cut):
    array = pa.array(values, pa.decimal128(38, 2))
    chunked = pa.chunked_array([array[:cut], array[cut:]] if cut < len(values) else [array])
    assert decimal_units(chunked) == [unscaled(v, 2) for v in values]
