"""Binary searches over rows in key order agree with the masks they replace.

A chunk task asks of every file it reads which rows sort after the position and how many sort
before the next file's lower bound (storage/chunks/key_search.py). For rows in key order it answers
by a binary search of Python compares; the masks (Arrow compute) answer for any rows. Here
generated pk shapes (integer and string columns, either direction, repeated keys), rows sorted
as a chunk task sorts them and keys inside, between and outside the rows must give the same
answers both ways. Pure Arrow: no Spark.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.key_types import KeyColumn
from backfill_assets.core.keys import KeyOrder
from backfill_assets.storage.chunks.key_search import (
    after,
    count_before,
    in_key_order,
    rows_after,
    searchable,
)

_VALUES = {"bigint": st.integers(-50, 50), "int": st.integers(-5, 5),
           "string": st.text(alphabet="ab\u00fc\u4e2d", max_size=3)}
_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string()}


@st.composite
def _case(draw):
    types = draw(st.lists(st.sampled_from(sorted(_VALUES)), min_size=1, max_size=3))
    order = KeyOrder(tuple(KeyColumn(f"k{i}", t, descending=draw(st.booleans()))
                           for i, t in enumerate(types)))
    key = st.tuples(*[_VALUES[t] for t in types])
    rows = draw(st.lists(key, max_size=40))
    probes = draw(st.lists(key, min_size=1, max_size=5)) + rows[:3]
    table = pa.table({f"k{i}": pa.array([r[i] for r in rows], _ARROW[t])
                      for i, t in enumerate(types)})
    sort = [(c.name, "descending" if c.descending else "ascending") for c in order.columns]
    return order, table.take(pc.sort_indices(table, sort_keys=sort)), probes


def _masked_after(table: pa.Table, order: KeyOrder, key) -> pa.Table:
    return table.filter(after(table, order, key)) if table.num_rows else table


@settings(max_examples=300, deadline=None)
@given(_case())
def test_searches_of_sorted_rows_equal_the_masks(case):
    order, table, probes = case
    assert searchable(table, order)
    # a single integer pk is searched in numpy (strictly increasing) and never flagged here
    single_int = len(order.columns) == 1 and order.columns[0].type in ("int", "bigint")
    ordered = in_key_order(table, order)
    assert ordered == (table.num_rows > 0 and not single_int)
    for key in probes:
        assert rows_after(table, order, key, ordered).to_pylist() == \
            _masked_after(table, order, key).to_pylist()
        assert count_before(table, order, key, ordered) == count_before(table, order, key)


@settings(max_examples=200, deadline=None)
@given(_case(), st.randoms(use_true_random=False))
def test_rows_out_of_order_are_not_searched(case, rnd):
    order, table, _ = case
    if len(order.columns) == 1 and order.columns[0].type != "string":
        return
    shuffled = table.take(pa.array(rnd.sample(range(table.num_rows), table.num_rows),
                                        pa.int64()))
    keys = [tuple(r.values()) for r in shuffled.to_pylist()]
    sorted_keys = sorted(keys, key=order.sort_key)
    in_order = all(order.compare(a, b) == 0 for a, b in zip(keys, sorted_keys, strict=True))
    assert in_key_order(shuffled, order) == (in_order and shuffled.num_rows > 0)


def test_a_null_pk_keeps_the_masks():
    order = KeyOrder((KeyColumn("k0", "string"), KeyColumn("k1", "bigint")))
    table = pa.table({"k0": ["a", "a", None], "k1": [1, 2, 3]})
    assert not searchable(table, order) and not in_key_order(table, order)
    assert rows_after(table, order, ("a", 1)).to_pylist() == [{"k0": "a", "k1": 2}]
