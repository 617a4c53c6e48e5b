"""The two Arrow algebras composed as an aggregate join MV will run them: each barrier's
signed joined rows (arrow/join_state.py), filtered, enter the aggregate state
(arrow/aggregate_state.py), and the aggregate MV equals the join recomputed from the tables
followed by GROUP BY, after every barrier of random DML on the fact and both dimensions."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.aggregate_state import SIGN, AggregateTables, value_column
from backfill_assets.core.join_algebra import JoinPlan
from tests.core.join_model import Tables, barrier, naive_join
from tests.core.test_join_algebra import AGG_PLAN, AGGREGATES, KINDS, group_by
from tests.test_arrow_joins import Store, tables_for

AGG = AggregateTables(AGG_PLAN, [("id", "bigint")], vnode_count=8)


def aggregate_input(joined: pa.Table) -> pa.Table:
    """The joined rows the filter keeps (``amount IS NULL OR amount % 5 <> 0``) as the
    aggregate's signed changes: group column, fact pk, one argument per aggregate."""
    amount = joined.column("amount")
    keep = pc.or_kleene(pc.is_null(amount), pc.not_equal(
        pc.subtract(amount, pc.multiply(pc.divide(amount, 5), 5)), 0))
    rows = joined.filter(keep)
    args = {a.name: rows.column(a.arg) for a in AGGREGATES if a.arg}
    columns = {SIGN: rows.column(SIGN), "region": rows.column("region"), "id": rows.column("id")}
    columns |= {value_column(i): args[a.name] for i, a in enumerate(AGGREGATES) if a.arg}
    return pa.table(columns).cast(AGG.change_schema)


class AggregateStore:
    """The aggregate's state, kept input and MV as dicts keyed like their Delta tables."""

    def __init__(self) -> None:
        self.state: dict[tuple, dict] = {}
        self.inputs: dict[tuple, dict] = {}
        self.mv: dict[tuple, dict] = {}

    def apply(self, changes: pa.Table) -> None:
        update = AGG.apply(pa.Table.from_pylist(list(self.state.values()), AGG.state_schema),
                           pa.Table.from_pylist(list(self.inputs.values()), AGG.input_schema),
                           changes)
        for table, store, width in ((update.state_deletes, self.state, 1),
                                    (update.input_deletes, self.inputs, 2),
                                    (update.mv_deletes, self.mv, 1)):
            for row in table.to_pylist():
                del store[tuple(row.values())[:width]]
        for table, store, width in ((update.state_upserts, self.state, 1),
                                    (update.input_upserts, self.inputs, 2),
                                    (update.mv_upserts, self.mv, 1)):
            for row in table.to_pylist():
                store[tuple(row.values())[:width]] = row


@settings(max_examples=60, deadline=None)
@given(KINDS, st.data())
def test_arrow_join_then_arrow_aggregate_equals_the_join_grouped(kinds, data) -> None:
    t, tables = tables_for(kinds), Tables()
    joins, aggregate = Store(t), AggregateStore()
    plan: JoinPlan = t.plan
    for _ in range(data.draw(st.integers(1, 6))):
        facts, dims = data.draw(barrier(tables))
        joins.apply(facts, dims)
        aggregate.apply(aggregate_input(joins.joined))
        want = group_by(list(naive_join(plan, tables).values()))
        got = {g: tuple(row[a.name] for a in AGGREGATES) for g, row in aggregate.mv.items()}
        assert got == want
