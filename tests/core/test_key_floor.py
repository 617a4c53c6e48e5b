"""A file's floor after a position (``core.key_floor``) admits every key the file holds after
it, is None only when it holds none, and floors order as the least keys they admit: checked
against the keys themselves over generated key orders (one to three columns, either
direction, int or string), files (their box from per-column min/max, with or without the
exact first key) and positions."""

from __future__ import annotations

import functools
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.key_floor import (
    ANY,
    Floor,
    admits_at_or_before,
    compare_floors,
    floor_after,
)
from backfill_assets.core.keys import KeyColumn, KeyOrder

_VALUES = {"bigint": st.integers(0, 6), "string": st.sampled_from(["a", "b", "c", "d"])}


@st.composite
def _case(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(_VALUES)), min_size=1, max_size=3))
    order = KeyOrder(tuple(KeyColumn(f"k{i}", k, descending=draw(st.booleans()))
                           for i, k in enumerate(kinds)))
    key = st.tuples(*(_VALUES[k] for k in kinds))
    keys = draw(st.lists(key, min_size=1, max_size=12, unique=True))
    pos = draw(st.none() | key)
    unbounded = draw(st.sets(st.integers(0, len(kinds) - 1)))  # columns without stats
    exact = draw(st.booleans())
    return order, keys, pos, unbounded, exact, key


def _box(order: KeyOrder, keys, unbounded):
    """Per column, the first and last value in key order (None: no stats)."""
    low, high = [], []
    for i, c in enumerate(order.columns):
        values = sorted({k[i] for k in keys}, reverse=c.descending)
        low.append(None if i in unbounded else values[0])
        high.append(None if i in unbounded else values[-1])
    return low, high


@settings(max_examples=300, deadline=None)
@given(_case())
def test_the_floor_admits_every_key_after_the_position(case):
    order, keys, pos, unbounded, exact, _ = case
    ordered = sorted(keys, key=functools.cmp_to_key(order.compare))
    low, high = _box(order, keys, unbounded)
    floor = floor_after(order, low, high, pos, ordered[0] if exact else None)
    after = [k for k in ordered if pos is None or order.compare(k, pos) > 0]
    if floor is None:
        assert not after
        return
    for k in after:  # the floor is a lower bound of every key after the position
        assert admits_at_or_before(order, floor, k), (floor, k)
    if pos is not None:  # and nothing at or before the position
        assert not admits_at_or_before(order, floor, pos), (floor, pos)


@settings(max_examples=200, deadline=None)
@given(_case(), st.data())
def test_floors_order_as_the_least_keys_they_admit(case, data):
    order, _, _, _, _, key = case
    n = len(order.columns)

    def floor() -> Floor:
        k, length = data.draw(key), data.draw(st.integers(0, n))
        return Floor(tuple(k[:length]), open=length > 0 and data.draw(st.booleans()))

    floors = [floor() for _ in range(4)] + [ANY]
    universe = list(itertools.product(*(sorted(
        set(data.draw(st.lists(_VALUES[c.type], min_size=1, max_size=3)))
        | {v for f in floors for j, v in enumerate(f.prefix) if j == i})
        for i, c in enumerate(order.columns))))
    universe.sort(key=functools.cmp_to_key(order.compare))

    def least(f: Floor) -> int:  # index of the least key of the universe the floor admits
        return next((i for i, k in enumerate(universe) if admits_at_or_before(order, f, k)),
                    len(universe))

    for a in floors:
        for b in floors:
            c = compare_floors(order, a, b)
            if c < 0:
                assert least(a) <= least(b), (a, b)
            elif c > 0:
                assert least(a) >= least(b), (a, b)
            else:
                assert least(a) == least(b), (a, b)
