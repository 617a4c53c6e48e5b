"""Binary searches and the merge of change rows over key-ordered rows (storage/sorted_rows.py).

Generated keys of one to three columns (integers, strings, dates; each column ascending or
descending), in key order or shuffled, with repeats and nulls. Oracles: Python's ``sorted`` and
``bisect`` under ``KeyOrder.sort_key``, and the general path a chunk read takes otherwise
(``replica.overlay``, a filter after the position, a sort).
"""

from __future__ import annotations

import bisect
import datetime as dt

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import replica as R
from backfill_assets.storage.chunk_task import take_chunk
from backfill_assets.storage.sorted_rows import SortedRows, merge_changes

TYPES = {
    "bigint": (pa.int64(), st.integers(-5, 5)),
    "int": (pa.int32(), st.integers(0, 3)),
    "string": (pa.string(), st.sampled_from(["", "a", "ab", "b", "é", "z"])),
    "date": (pa.date32(), st.dates(dt.date(2020, 1, 1), dt.date(2020, 1, 4))),
}


@st.composite
def key_orders(draw) -> KeyOrder:
    kinds = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3))
    return KeyOrder(tuple(KeyColumn(f"k{i}", kind, descending=draw(st.booleans()))
                          for i, kind in enumerate(kinds)))


def _keys(order: KeyOrder, nullable: bool = False):
    values = [TYPES[c.type][1] for c in order.columns]
    if nullable:
        values = [v | st.none() for v in values]
    return st.tuples(*values)


def _table(order: KeyOrder, keys: list[tuple], extra: dict | None = None) -> pa.Table:
    cols = {c.name: pa.array([k[i] for k in keys], TYPES[c.type][0])
            for i, c in enumerate(order.columns)}
    cols["vnode"] = pa.array([0] * len(keys), pa.int32())
    return pa.table({**cols, **(extra or {})})


def _strictly_sorted(order: KeyOrder, keys: list[tuple]) -> bool:
    return all(None not in k for k in keys) and all(
        order.compare(a, b) < 0 for a, b in zip(keys, keys[1:], strict=False))


@settings(max_examples=300, deadline=None)
@given(key_orders().flatmap(lambda o: st.tuples(
    st.just(o), st.lists(_keys(o, nullable=True), max_size=12), st.booleans(),
    st.lists(_keys(o), min_size=1, max_size=4))))
def test_searches_equal_python_bisect_and_unsorted_rows_are_refused(case):
    order, keys, presort, probes = case
    if presort and all(None not in k for k in keys):
        keys = sorted(set(keys), key=order.sort_key)
    rows = SortedRows.of(_table(order, keys), order)
    assert (rows is not None) == _strictly_sorted(order, keys)
    if rows is None:
        return
    ranked = [order.sort_key(k) for k in keys]
    for probe in probes:
        p = order.sort_key(probe)
        assert rows.bisect(probe, right=False) == bisect.bisect_left(ranked, p)
        assert rows.bisect(probe, right=True) == bisect.bisect_right(ranked, p)
        assert rows.before(probe) == bisect.bisect_left(ranked, p)
        after = rows.after(probe)
        assert [after.key(i) for i in range(after.num_rows)] == \
            keys[bisect.bisect_right(ranked, p):]
        found = rows.find(probe)
        assert (found is not None) == (probe in keys)
        assert found is None or keys[found] == probe


@settings(max_examples=300, deadline=None)
@given(key_orders().flatmap(lambda o: st.tuples(
    st.just(o), st.sets(_keys(o), max_size=12),
    st.lists(st.tuples(_keys(o), st.integers(2, 4), st.booleans()), max_size=8),
    st.none() | _keys(o))))
def test_merged_changes_equal_the_overlay_and_a_sort(case):
    """Base rows after a position, change rows at later versions (updates, deletes, inserts,
    a key twice at one version): the merge equals the general path, row for row."""
    order, base_keys, changes, pos = case
    base_keys = sorted((k for k in base_keys if pos is None or order.compare(k, pos) > 0),
                       key=order.sort_key)
    n = len(base_keys)
    base = _table(order, base_keys, {
        "val": pa.array(range(n), pa.int64()), R.VERSION: pa.array([1] * n, pa.int64()),
        R.DELETED: pa.array([False] * n, pa.bool_())})
    m = len(changes)
    change_rows = _table(order, [k for k, _, _ in changes], {
        "val": pa.array(range(100, 100 + m), pa.int64()),
        R.VERSION: pa.array([v for _, v, _ in changes], pa.int64()),
        R.DELETED: pa.array([d for _, _, d in changes], pa.bool_())})
    rows = SortedRows.of(base, order)
    assert rows is not None
    merged = merge_changes(rows, change_rows, pos, R.resolve)
    general = take_chunk(R.overlay(base, change_rows, order), order,
                         {0: pos} if pos is not None else {}, 1 << 30, False)
    assert merged is not None
    assert merged.to_pylist() == general.drop_columns(
        [general.column_names[-2], general.column_names[-1]]).to_pylist()
