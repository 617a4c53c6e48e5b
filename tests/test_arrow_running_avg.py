"""The numpy decimal avg (arrow/running_avg.py) against the exact reference
(`core.aggregates.exact_values`): the same value for every drawn sum and count, including
halves, negatives, zero counts and sums at the edge of the int64 path."""

from __future__ import annotations

import decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.running_avg import decimal_avg
from backfill_assets.core.aggregates import AggregatePlan, exact_values
from backfill_assets.core.mv_definition import MVDefinition

EDGE = 10 ** 17


def _plan(precision: int, scale: int) -> AggregatePlan:
    d = MVDefinition.from_dict({"name": "m", "upstream": "u", "primary_key": ["id"],
                                "group_by": ["g"], "aggregates": {"a": "avg(x)"}})
    return AggregatePlan.of(d.group_by, d.aggregates,
                            {"g": "bigint", "a": f"decimal({precision},{scale})"})


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 28), st.data())
def test_the_numpy_avg_is_the_reference(precision: int, data) -> None:
    scale = data.draw(st.integers(0, min(precision, 10)))
    plan = _plan(precision, scale)
    units = st.one_of(st.integers(-EDGE, EDGE), st.integers(-1000, 1000),
                      st.sampled_from([0, 5, -5, 15, -15, 2**62, -(2**62), 10**30]))
    groups = data.draw(st.lists(st.tuples(units, st.integers(0, 40)), max_size=30))
    sums = [u for u, _ in groups]
    counts = [c for _, c in groups]
    sum_type = pa.decimal128(38, plan.sum_scale(0))
    column = pa.array([decimal.Decimal(u).scaleb(-plan.sum_scale(0)) for u in sums], sum_type)
    result = pa.decimal128(*[int(x) for x in plan.result_types[0][8:-1].split(",")])
    try:
        expected = exact_values(plan, 0, sums, counts)
    except Exception:  # noqa: BLE001 - an overflow the reference names: the fast path defers
        expected = None
    fast = decimal_avg(column, pa.array(counts, pa.int64()), plan.sum_scale(0), result)
    if fast is None:
        return  # the caller takes the reference
    assert expected is not None, "the fast path accepted what the reference refuses"
    assert fast.to_pylist() == expected
