"""The vectorised aggregate algebra (arrow/aggregate_state.py) against a naive GROUP BY from
scratch after every batch of random DML, with the state and kept input carried between
batches only as the tables it writes (upserts and deletes by key), as Delta will carry them."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import given, settings

from backfill_assets.arrow.aggregate_state import SIGN, AggregateTables, value_column
from backfill_assets.core.aggregates import group_vnode
from backfill_assets.core.errors import AggregateStateMismatch
from backfill_assets.core.names import VNODE
from tests.core.aggregate_model import (
    AGGREGATES,
    PLAN,
    float_tolerance,
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
        want = recompute(table)
        got = {g: tuple(row[a.name] for a in AGGREGATES) for g, row in store.mv.items()}
        floats = {a.name for a, t in zip(AGGREGATES, PLAN.result_types, strict=True)
                  if t == "double" and a.name.endswith("_f")}
        for g in set(got) & set(want):  # pyarrow adds floats in its own order: Spark's bound
            for k, a in enumerate(AGGREGATES):
                if a.name in floats and got[g][k] is not None and want[g][a.name] is not None:
                    bound = float_tolerance(table, g, a.arg)
                    assert abs(got[g][k] - want[g][a.name]) <= bound, (g, a.name)
                    want[g][a.name] = got[g][k]
        assert_same_mv(got, want)
        assert set(store.state) == set(store.mv)


def test_a_retraction_the_state_never_held_is_refused() -> None:
    signed = to_signed([("insert", 1, {"g1": 1, "g2": "a", "i": 1, "d": None, "s": None,
                                       "f": None, "b": None})], {})
    bad = changes_table(signed).set_column(0, SIGN, pa.array([-1], pa.int8()))
    with pytest.raises(AggregateStateMismatch, match="reset the MV"):
        Store().apply(bad)


def test_the_state_tables_are_keyed_by_group_and_hidden_columns_are_internal() -> None:
    assert TABLES.state_schema.names[:3] == ["g1", "g2", "__bf_rows"]
    assert TABLES.input_schema.names[:3] == ["g1", "g2", "id"]
    assert TABLES.mv_schema.names == [*GROUPS, *(a.name for a in AGGREGATES), VNODE]
    assert str(TABLES.state_schema.field("__bf_sum_3").type) == "decimal128(38, 2)"
    assert math.isnan(float("nan"))
