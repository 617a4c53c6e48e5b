"""The vectorised aggregate algebra (arrow/aggregate_state.py) against a naive GROUP BY from
scratch after every batch of random DML, with the state and kept input carried between
batches only as the tables it writes (upserts and deletes by key), as Delta will carry them."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings

from backfill_assets.arrow.aggregate_state import SIGN, AggregateTables, value_column
from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import AggregatePlan, group_vnode
from backfill_assets.core.errors import AggregateOverflow, AggregateStateMismatch
from backfill_assets.core.names import VNODE
from tests.core.aggregate_model import (
    AGGREGATES,
    PLAN,
    histories,
    recompute,
    to_signed,
)
from tests.core.test_aggregates import assert_same_mv

TABLES = AggregateTables(PLAN, [("id", "bigint")], vnode_count=16)
GROUPS = TABLES.group_names


def changes_table(signed) -> pa.Table:
    cols = {SIGN: [r.sign for r in signed], "g1": [r.group[0] for r in signed],
            "g2": [r.group[1] for r in signed], "id": [r.pk[0] for r in signed]}
    for i in TABLES.args:
        cols[value_column(i)] = [r.values[i] for r in signed]
    return pa.Table.from_pydict(cols, schema=TABLES.change_schema)


class Store:
    """The three tables as dicts keyed like their Delta tables."""

    def __init__(self) -> None:
        self.state: dict[tuple, dict] = {}
        self.inputs: dict[tuple, dict] = {}
        self.mv: dict[tuple, dict] = {}

    def apply(self, changes: pa.Table) -> None:
        update = TABLES.apply(pa.Table.from_pylist(list(self.state.values()),
                                                   TABLES.state_schema),
                              pa.Table.from_pylist(list(self.inputs.values()),
                                                   TABLES.input_schema), changes)
        pk = len(GROUPS) + 1
        for table, store, width in ((update.state_deletes, self.state, len(GROUPS)),
                                    (update.input_deletes, self.inputs, pk),
                                    (update.mv_deletes, self.mv, len(GROUPS))):
            for row in table.to_pylist():
                key = tuple(row.values())[:width]
                assert row[VNODE] == group_vnode(key[:2], PLAN.group_types, 16)
                del store[key]  # a delete names a row that is there
        for table, store, width in ((update.state_upserts, self.state, len(GROUPS)),
                                    (update.input_upserts, self.inputs, pk),
                                    (update.mv_upserts, self.mv, len(GROUPS))):
            assert table.schema == {id(self.state): TABLES.state_schema,
                                    id(self.inputs): TABLES.input_schema,
                                    id(self.mv): TABLES.mv_schema}[id(store)]
            for row in table.to_pylist():
                store[tuple(row.values())[:width]] = row


@settings(max_examples=60)
@given(histories())
def test_arrow_state_mv_equals_recomputation_after_every_batch(batches) -> None:
    table: dict[int, dict] = {}
    store = Store()
    for batch in batches:
        store.apply(changes_table(to_signed(batch, table)))
        got = {g: tuple(row[a.name] for a in AGGREGATES) for g, row in store.mv.items()}
        assert_same_mv(got, recompute(table))  # float sums too: both correctly rounded
        assert set(store.state) == set(store.mv)


def test_a_retraction_the_state_never_held_is_refused() -> None:
    signed = to_signed([("insert", 1, {"g1": 1, "g2": "a", "i": 1, "d": None, "s": None,
                                       "f": None, "b": None})], {})
    bad = changes_table(signed).set_column(0, SIGN, pa.array([-1], pa.int8()))
    with pytest.raises(AggregateStateMismatch, match="reset the MV"):
        Store().apply(bad)


def test_a_sum_beyond_38_digits_is_refused_but_not_a_transient_one_inside_a_batch() -> None:
    plan = AggregatePlan.of((GroupColumn("g", "g"),), parse_aggregates({"t": "sum(v)"}),
                            {"g": "int", "t": "decimal(38,0)"})
    tables = AggregateTables(plan, [("id", "int")], 4)
    nines = Decimal("9" * 38)
    rows = {SIGN: [1, 1, 1], "g": [1, 1, 1], "id": [1, 2, 3], value_column(0): [nines] * 3}
    none = tables.state_schema.empty_table(), tables.input_schema.empty_table()
    with pytest.raises(AggregateOverflow, match="leaves 38 digits"):
        tables.apply(*none, pa.Table.from_pydict(rows, schema=tables.change_schema))
    rows[SIGN] = [1, 1, -1]  # 2·(10^38-1) on the way, 0 in the end: no overflow
    rows["id"] = [1, 2, 2]
    done = tables.apply(*none, pa.Table.from_pydict(rows, schema=tables.change_schema))
    assert done.mv_upserts.column("t").to_pylist() == [nines]


def test_the_state_tables_are_keyed_by_group_and_hidden_columns_are_internal() -> None:
    assert TABLES.state_schema.names[:3] == ["g1", "g2", "__bf_rows"]
    assert TABLES.input_schema.names[:3] == ["g1", "g2", "id"]
    assert TABLES.mv_schema.names == [*GROUPS, *(a.name for a in AGGREGATES), VNODE]
    assert str(TABLES.state_schema.field("__bf_sum_3").type) == "decimal128(38, 2)"
