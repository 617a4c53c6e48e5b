"""The pure join algebra (core/join_algebra.py) against the join recomputed from the whole
tables after every barrier of random DML on the fact and both dimensions, row for row, for
inner and left joins; and joined then aggregated (core/aggregates.py) against the naive join
followed by a GROUP BY."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import AggregatePlan, GroupState, SignedRow, apply_batch
from backfill_assets.core.errors import DimensionKeyNotUnique, JoinStateMismatch
from backfill_assets.core.join_algebra import (
    JoinState,
    Signed,
    net_rows,
)
from backfill_assets.core.join_algebra import apply_batch as join_batch
from backfill_assets.core.vnode import vnode_of
from tests.core.join_model import PK, Tables, barrier, naive_join, plan

KINDS = st.tuples(st.sampled_from(["inner", "left"]), st.sampled_from(["inner", "left"]))


def apply_to_mv(mv: dict[tuple, dict], signed: list[tuple[int, dict]]) -> None:
    """The row MV's merge: upsert the row after, delete a key with no row after."""
    for key, row in net_rows(signed, PK).items():
        if row is None:
            assert mv.pop(key, None) is not None  # only a row that is there is deleted
        else:
            mv[key] = row


@settings(max_examples=200)
@given(KINDS, st.data())
def test_joined_rows_equal_the_join_recomputed_after_every_barrier(kinds, data) -> None:
    p, t = plan(kinds), Tables()
    state, mv = JoinState.empty(p), {}
    for _ in range(data.draw(st.integers(1, 8))):
        facts, dims = data.draw(barrier(t))
        # one barrier, or its dimension side then its fact side: the same tables at the end
        split = data.draw(st.booleans())
        batches = [([], dims), (facts, [[], []])] if split else [(facts, dims)]
        for f, d in batches:
            signed = join_batch(p, state, f, d)
            for sign, row in signed:  # the signed rows carry whole joined rows
                assert sign in (1, -1) and tuple(row) == p.output_columns
            apply_to_mv(mv, signed)
        assert mv == naive_join(p, t)
        assert state.facts == t.facts  # the fact rows as the MV reads them, nothing more
        for i, side in enumerate(p.sides):  # the index lists each non-null key's facts
            want: dict[tuple, set] = {}
            for pk, row in t.facts.items():
                key = tuple(row[c] for c in side.on)
                if None not in key:
                    want.setdefault(key, set()).add(pk)
            assert state.index[i] == want


GROUPS = (GroupColumn("region", "region"),)
AGGREGATES = parse_aggregates({"n": "count(*)", "total": "sum(amount)", "value": "sum(price)",
                               "top": "max(amount)", "tiers": "count(DISTINCT cust_tier)"})
AGG_PLAN = AggregatePlan.of(GROUPS, AGGREGATES, {"region": "string", "total": "int",
                                                 "value": "decimal(7,2)", "top": "int",
                                                 "tiers": "int"})


def passes(row: dict) -> bool:
    """The MV's filter over joined rows: ``amount IS NULL OR amount % 5 <> 0``."""
    return row["amount"] is None or row["amount"] % 5 != 0


def group_by(rows: list[dict]) -> dict[tuple, tuple]:
    """The naive GROUP BY region over the filtered joined rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if passes(r):
            groups.setdefault((r["region"],), []).append(r)
    out = {}
    for g, rs in groups.items():
        amounts = [r["amount"] for r in rs if r["amount"] is not None]
        prices = [r["price"] for r in rs if r["price"] is not None]
        out[g] = (len(rs), sum(amounts) if amounts else None, sum(prices) if prices else None,
                  max(amounts, default=None),
                  len({r["cust_tier"] for r in rs if r["cust_tier"] is not None}))
    return out


@settings(max_examples=150)
@given(KINDS, st.data())
def test_joined_then_aggregated_equals_the_naive_join_grouped(kinds, data) -> None:
    p, t = plan(kinds), Tables()
    state = JoinState.empty(p)
    states: dict[tuple, GroupState] = {}
    inputs: dict[tuple, dict] = {}
    mv: dict[tuple, tuple] = {}
    for _ in range(data.draw(st.integers(1, 8))):
        facts, dims = data.draw(barrier(t))
        rows = [SignedRow(sign, (r["region"],), (r["id"],),
                          (None, r["amount"], r["price"], r["amount"], r["cust_tier"]))
                for sign, r in join_batch(p, state, facts, dims) if passes(r)]
        result = apply_batch(AGG_PLAN, states, inputs, rows)
        for g, s in result.states.items():
            states.pop(g, None) if s is None else states.__setitem__(g, s)
        inputs.update(result.inputs)
        for g in result.deletes:
            del mv[g]
        mv.update(result.upserts)
        want = group_by(list(naive_join(p, t).values()))
        assert mv.keys() == want.keys()
        for g, values in want.items():
            assert mv[g][:4] == values[:4] and mv[g][4] == values[4], g


def _one(kind: str):
    return plan((kind, "left"))


def test_a_late_customer_fills_the_left_rows_then_its_delete_pads_them_again() -> None:
    p = _one("left")
    state = JoinState.empty(p)
    fact = {"id": 1, "cust": 7, "pcode": None, "pver": None, "amount": 5}
    first = join_batch(p, state, [Signed(1, fact)], [[], []])
    assert [(s, r["region"]) for s, r in first] == [(1, None)]
    customer = {"cid": 7, "region": "north", "tier": 1, "note": "x"}
    late = join_batch(p, state, [], [[Signed(1, customer)], []])
    assert [(s, r["region"], r["cust_tier"]) for s, r in late] == [(-1, None, None),
                                                                    (1, "north", 1)]
    gone = join_batch(p, state, [], [[Signed(-1, customer)], []])
    assert [(s, r["region"]) for s, r in gone] == [(-1, "north"), (1, None)]


def test_an_inner_join_drops_the_rows_of_a_deleted_customer_and_ignores_other_columns() -> None:
    p = _one("inner")
    state = JoinState.empty(p)
    customer = {"cid": 7, "region": "north", "tier": 1, "note": "x"}
    join_batch(p, state, [], [[Signed(1, customer)], []])
    fact = {"id": 1, "cust": 7, "pcode": None, "pver": None, "amount": 5}
    assert [s for s, _ in join_batch(p, state, [Signed(1, fact)], [[], []])] == [1]
    noted = {**customer, "note": "y"}  # a column no join carries: no MV row changes
    assert join_batch(p, state, [], [[Signed(-1, customer), Signed(1, noted)], []]) == []
    assert [s for s, _ in join_batch(p, state, [], [[Signed(-1, noted)], []])] == [-1]
    null_key = {**fact, "id": 2, "cust": None}  # a null key matches nothing, not even a null
    assert join_batch(p, state, [Signed(1, null_key)], [[], []]) == []


def test_a_dimension_key_held_twice_is_refused_by_name() -> None:
    p = _one("left")
    state = JoinState.empty(p)
    customer = {"cid": 7, "region": "north", "tier": 1, "note": "x"}
    with pytest.raises(DimensionKeyNotUnique, match="declared key is not unique"):
        join_batch(p, state, [], [[Signed(1, customer), Signed(1, customer)], []])
    join_batch(p, state, [], [[Signed(1, customer)], []])
    with pytest.raises(DimensionKeyNotUnique, match="already holds"):
        join_batch(p, state, [], [[Signed(1, customer)], []])
    with pytest.raises(JoinStateMismatch, match="never held"):
        join_batch(p, state, [Signed(-1, {"id": 9, "cust": 1})], [[], []])


@settings(max_examples=100)
@given(KINDS, st.integers(1, 3), st.data())
def test_arrangement_dimension_changes_reach_only_facts_at_or_below_their_position(
        kinds, vnodes, data) -> None:
    """Arrangement mode: per fact vnode a position; fact changes enter only at or below it,
    each barrier's snapshot chunk brings the current rows of the keys it passes, and every
    dimension change enters whole. After each barrier the MV is the join of exactly the facts
    at or below their vnode's position (the index holds only those, so a dimension change
    needs no visibility test of its own)."""
    p, t = plan(kinds), Tables()
    state, mv, pos = JoinState.empty(p), {}, [-1] * vnodes
    for _ in range(data.draw(st.integers(1, 8))):
        facts, dims = data.draw(barrier(t))
        vnode = {pk: vnode_of(pk, ["bigint"], vnodes) for pk in [*t.facts, *(
            (c.row["id"],) for c in facts)]}
        seen = [c for c in facts if c.row["id"] <= pos[vnode[(c.row["id"],)]]]
        new_pos = [p_ + data.draw(st.integers(0, 3)) for p_ in pos]
        chunk = [Signed(1, row) for pk, row in t.facts.items()
                 if pos[vnode[pk]] < pk[0] <= new_pos[vnode[pk]]]
        apply_to_mv(mv, join_batch(p, state, seen + chunk, dims))
        pos = new_pos
        visible = Tables()
        visible.customers, visible.products = t.customers, t.products
        visible.facts = {pk: r for pk, r in t.facts.items() if pk[0] <= pos[vnode[pk]]}
        assert mv == naive_join(p, visible)
        assert state.facts == visible.facts
