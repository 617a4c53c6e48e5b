"""Running sums added as int64 units (arrow/narrow_sums.py) against Python's exact ints: the
bound picks the int64 path or the decimal256 one, and either gives the exact sum, at int64's
edges included."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.aggregate_state import SIGN, AggregateTables, sum_column, value_column
from backfill_assets.arrow.narrow_sums import signed_units
from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import AggregatePlan

_TOP = 2**63 - 1
_EDGES = [0, 1, -1, _TOP, -_TOP, -(2**63), 2**62, -(2**62), 2**53 + 1]


def _tables(type_name: str) -> AggregateTables:
    plan = AggregatePlan.of((GroupColumn("g", "g"),), parse_aggregates({"t": "sum(v)"}),
                            {"g": "int", "t": type_name})
    return AggregateTables(plan, [("id", "int")], 4)


def _state(tables: AggregateTables, sums: dict[int, int], scale: int) -> pa.Table:
    """Each old group holds one row, whose value is the group's sum."""
    rows = [{"g": g, "__bf_rows": 1, "__bf_count_0": 1,
             sum_column(0): Decimal(s).scaleb(-scale), "vnode": 0} for g, s in sums.items()]
    return pa.Table.from_pylist(rows, tables.state_schema)


@settings(max_examples=120, deadline=None)
@given(old=st.lists(st.sampled_from(_EDGES) | st.integers(-(2**40), 2**40), min_size=1,
                    max_size=3),
       changes=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(_EDGES)
                                  | st.integers(-(2**40), 2**40)), max_size=6),
       decimal=st.booleans())
def test_sums_equal_python_ints_on_either_path(old, changes, decimal) -> None:
    """Old group sums plus inserted changes (each a +1 row) equal Python's sums, or the batch
    is refused as Spark would refuse it (38 digits: only past int64 here when the input is a
    bigint, whose sum is a decimal(38, 0))."""
    scale = 2 if decimal else 0
    tables = _tables("decimal(18,2)" if decimal else "bigint")
    values = [v for _, v in changes]
    if decimal:
        values = [max(min(v, 10**18 - 1), -(10**18 - 1)) for v in values]
    sums = {g: s for g, s in enumerate(old)}
    state = _state(tables, sums, scale)
    batch = pa.Table.from_pydict({
        SIGN: [1] * len(changes), "g": [g % len(old) for g, _ in changes],
        "id": list(range(len(changes))),
        value_column(0): [Decimal(v).scaleb(-scale) if decimal else v for v in values]},
        schema=tables.change_schema)
    new, _ = tables.state_update(state, batch)
    expected = dict(sums)
    for (g, _), v in zip(changes, values, strict=True):
        expected[g % len(old)] += v
    got = {row["g"]: int(row[sum_column(0)].scaleb(scale)) for row in new.to_pylist()}
    assert got == {g: expected[g] for g in got}


def test_the_bound_refuses_what_could_leave_int64() -> None:
    old = pa.array([_TOP - 10], pa.int64())
    signs = np.array([1, 1], dtype=np.int64)
    assert signed_units([old], [pa.array([5, 5], pa.int64())], signs, [0]) is not None
    assert signed_units([old], [pa.array([5, 6], pa.int64())], signs, [0]) is None
    lowest = pa.array([-(2**63)], pa.int64())
    assert signed_units([lowest], [pa.array([0, 0], pa.int64())], signs, [0]) is None
    wrong_scale = pa.array([Decimal("1.5")], pa.decimal128(10, 1))
    assert signed_units([wrong_scale], [pa.array([1, 1], pa.int64())], signs, [0]) is None
