"""The pure aggregate algebra (core/aggregates.py) against a naive GROUP BY from scratch,
after every batch of random DML (group moves, deletes of the current min/max, nulls, groups
emptied, decimal edge values), row for row and type for type."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import (
    AggregatePlan,
    GroupState,
    SignedRow,
    apply_batch,
    exact_value,
    float_sum,
    group_vnode,
)
from backfill_assets.core.errors import AggregateOverflow, AggregateStateMismatch
from backfill_assets.core.vnode import vnode_of
from tests.core.aggregate_model import (
    AGGREGATES,
    PLAN,
    half_up,
    histories,
    recompute,
    to_signed,
)


class Reference:
    """The algebra's whole state, kept as the step will keep it in Delta tables."""

    def __init__(self) -> None:
        self.states: dict[tuple, GroupState] = {}
        self.inputs: dict[tuple, dict[tuple, tuple]] = {}
        self.mv: dict[tuple, tuple] = {}

    def apply(self, batch: list[SignedRow]) -> None:
        result = apply_batch(PLAN, self.states, self.inputs, batch)
        for group, state in result.states.items():
            if state is None:
                self.states.pop(group, None)
            else:
                self.states[group] = state
        self.inputs.update(result.inputs)
        assert result.deletes.isdisjoint(result.upserts)
        for group in result.deletes:
            assert self.mv.pop(group, None) is not None  # only a live group disappears
        self.mv.update(result.upserts)


def assert_same_mv(mv: dict[tuple, tuple], want: dict[tuple, dict]) -> None:
    """Row for row, value for value, type for type (a decimal's scale included)."""
    assert set(mv) == set(want)
    for group, values in mv.items():
        for a, t, got in zip(AGGREGATES, PLAN.result_types, values, strict=True):
            expected = want[group][a.name]
            assert got == expected or (got != got and expected != expected), (group, a.name)
            if got is None:
                continue
            if t == "bigint":
                assert type(got) is int and -(2**63) <= got < 2**63
            elif t == "double":
                assert type(got) is float
            elif t.startswith("decimal"):
                scale = int(t.split(",")[1].rstrip(")"))
                assert isinstance(got, Decimal) and got.as_tuple().exponent == -scale
            elif t == "string":
                assert type(got) is str


@settings(max_examples=150)
@given(histories())
def test_state_mv_equals_recomputation_after_every_batch(batches) -> None:
    table: dict[int, dict] = {}
    ref = Reference()
    for batch in batches:
        ref.apply(to_signed(batch, table))
        assert_same_mv(ref.mv, recompute(table))
        assert set(ref.states) == set(ref.mv)  # no state for a group that is gone


def test_result_types_are_sparks() -> None:
    assert dict(zip((a.name for a in AGGREGATES), PLAN.result_types, strict=True)) == {
        "n": "bigint", "n_d": "bigint", "sum_i": "bigint", "sum_d": "decimal(15,2)",
        "avg_i": "double", "avg_d": "decimal(9,6)", "min_d": "decimal(5,2)",
        "max_d": "decimal(5,2)", "max_s": "string", "min_s": "string", "sum_f": "double",
        "avg_f": "double", "min_f": "double", "max_i": "int", "distinct_s": "bigint",
        "big": "bigint", "avg_b": "double"}


def _plan(text: str, arg_type: str) -> AggregatePlan:
    return AggregatePlan.of((GroupColumn("g", "g"),), parse_aggregates({"x": text}),
                            {"g": "int", "x": arg_type})


def _rows(plan: AggregatePlan, *signed: tuple[int, int, object]) -> list[SignedRow]:
    return [SignedRow(s, (1,), (pk,), (v,)) for s, pk, v in signed]


def test_deleting_the_current_max_yields_the_next_and_the_last_row_drops_the_group() -> None:
    plan = _plan("max(v)", "decimal(5,2)")
    first = apply_batch(plan, {}, {}, _rows(plan, (1, 1, Decimal("1.00")),
                                             (1, 2, Decimal("9.99")), (1, 3, None)))
    assert first.upserts == {(1,): (Decimal("9.99"),)}
    second = apply_batch(plan, first.states, first.inputs, _rows(plan, (-1, 2, Decimal("9.99"))))
    assert second.upserts == {(1,): (Decimal("1.00"),)}
    third = apply_batch(plan, second.states, second.inputs, _rows(plan, (-1, 1, Decimal("1.00"))))
    assert third.upserts == {(1,): (None,)}  # a group of one null row: max is NULL
    last = apply_batch(plan, third.states, third.inputs, _rows(plan, (-1, 3, None)))
    assert (last.deletes, last.upserts, last.states) == ({(1,)}, {}, {(1,): None})


def test_avg_decimal_roundshalf_up_to_scale_plus_four() -> None:
    plan = _plan("avg(v)", "decimal(5,2)")
    out = apply_batch(plan, {}, {}, _rows(plan, (1, 1, Decimal("0.01")), (1, 2, Decimal("0.01")),
                                          (1, 3, Decimal("0.00"))))
    assert out.upserts[(1,)] == (Decimal("0.006667"),)  # 0.0066666... HALF_UP
    halves = apply_batch(plan, {}, {}, _rows(plan, (1, 1, Decimal("0.01")),
                                             *[(1, k, Decimal("0.00")) for k in range(2, 17)]))
    assert str(halves.upserts[(1,)][0]) == "0.000625"  # exactly representable: kept as is
    neg = apply_batch(plan, {}, {}, _rows(plan, (1, 1, Decimal("-0.01")), (1, 2, Decimal("0")),
                                          (1, 3, Decimal("0"))))
    assert neg.upserts[(1,)] == (Decimal("-0.003333"),)


@given(st.integers(-(10**38) + 1, 10**38 - 1), st.integers(1, 2**63 - 1))
def test_decimal_avg_is_sparks_truncate_thenhalf_up(units: int, count: int) -> None:
    plan = _plan("avg(v)", "decimal(38,2)")  # result decimal(38,6)
    q = Fraction(units, 100 * count)
    want = half_up(Fraction(math.trunc(q * 10**39), 10**39) * 10**6)
    if abs(want) >= 10**38:
        with pytest.raises(AggregateOverflow):
            exact_value(plan, 0, units, count)
    else:
        assert exact_value(plan, 0, units, count) == Decimal(f"{want}E-6")


def test_a_bigint_sum_beyond_bigint_is_refused_by_name_but_state_survives_transients() -> None:
    plan = _plan("sum(v)", "bigint")
    big = apply_batch(plan, {}, {}, _rows(plan, (1, 1, 2**62), (1, 2, 2**62), (1, 3, -(2**62))))
    assert big.upserts[(1,)] == (2**62,)
    with pytest.raises(AggregateOverflow, match="beyond bigint.*decimal"):
        apply_batch(plan, big.states, {}, _rows(plan, (-1, 3, -(2**62))))


def test_retracting_what_the_state_never_held_is_refused() -> None:
    plan = _plan("min(v)", "int")
    with pytest.raises(AggregateStateMismatch, match="reset the MV"):
        apply_batch(plan, {}, {}, _rows(plan, (-1, 1, 5)))
    held = apply_batch(plan, {}, {}, _rows(plan, (1, 1, 5)))
    with pytest.raises(AggregateStateMismatch, match="kept input"):
        apply_batch(plan, held.states, held.inputs, _rows(plan, (-1, 1, 6), (1, 1, 5)))


def test_float_sum_is_correctly_rounded_and_ieee_at_the_edges() -> None:
    assert float_sum([1e20, 1.0, -1e20]) == 1.0  # a running double sum would give 0.0
    assert math.isnan(float_sum([math.inf, -math.inf]))
    assert float_sum([math.inf, 1.0]) == math.inf
    assert float_sum([1.7e308, 1.7e308]) == math.inf
    plan = _plan("min(v)", "double")
    out = apply_batch(plan, {}, {}, _rows(plan, (1, 1, math.nan), (1, 2, 3.0)))
    assert out.upserts[(1,)] == (3.0,)  # Spark orders NaN above every number


def test_group_vnode_is_the_key_hash_and_takes_null_group_columns() -> None:
    assert group_vnode((5, "a"), ("int", "string"), 256) == vnode_of((5, "a"), ("int", "string"))
    assert 0 <= group_vnode((None, None), ("int", "string"), 8) < 8
