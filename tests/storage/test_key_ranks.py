"""``KeySpace``: packed ranks order keys as the key order does, for the table the space was
built from and for other keys it places, and a key it cannot place is said to be outside,
never given a wrong rank."""

from __future__ import annotations

import datetime as dt
import functools

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage.chunks.key_ranks import KeySpace

_TYPES = {
    "bigint": (pa.int64(), st.integers(-(2**62), 2**62)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "small_range": (pa.int64(), st.integers(-5, 5)),
    "string": (pa.string(), st.text("abc", max_size=3)),
    "date": (pa.date32(), st.dates(dt.date(1990, 1, 1), dt.date(2030, 1, 1))),
}


@st.composite
def _keys(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=3))
    names = [f"k{i}" for i in range(len(kinds))]
    order = KeyOrder(tuple(KeyColumn(n, "string" if k == "string" else "bigint",
                                     descending=draw(st.booleans()))
                           for n, k in zip(names, kinds, strict=True)))
    row = st.tuples(*(_TYPES[k][1] for k in kinds))
    built, other = draw(st.lists(row, min_size=1, max_size=30)), draw(st.lists(row, max_size=30))
    schema = pa.schema([(n, _TYPES[k][0]) for n, k in zip(names, kinds, strict=True)])
    table = lambda rows: pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)},  # noqa: E731
                                  schema=schema)
    return order, built, other, table


@settings(max_examples=200, deadline=None)
@given(_keys())
def test_ranks_order_as_the_keys_do(case):
    order, built, other, table = case
    space = KeySpace.of(table(built), order)
    if space is None:  # the ranks do not fit 62 bits: the callers sort instead
        return
    keys = built + other
    ranks, inside = space.encode(table(keys))
    assert inside[: len(built)].all()
    placed = [(k, int(r)) for k, r, i in zip(keys, ranks, inside, strict=True) if i]
    cmp = order.compare
    by_key = sorted(placed, key=functools.cmp_to_key(lambda x, y: cmp(x[0], y[0])))
    for (a, ra), (b, rb) in zip(by_key, by_key[1:], strict=False):
        assert (ra < rb) if cmp(a, b) < 0 else (ra == rb)
