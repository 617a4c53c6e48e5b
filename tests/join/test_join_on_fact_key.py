"""A join on the fact's own primary key (a one-to-one enrichment: orders joined to their
details by order id): the index's row is the join key then the pk's other columns, then the
other fact columns, each column once. Before, the index schema named `id` twice and the
first barrier's table creation failed (found by tests/catalog/test_mixed_catalog.py's join
whose dimension is another MV)."""

from __future__ import annotations

import pyarrow as pa

from backfill_assets.arrow.join_state import JoinTables
from backfill_assets.core.join_algebra import JoinPlan, Signed
from backfill_assets.core.join_definition import parse_joins
from tests.test_arrow_joins import Store

FACT_TYPES = {"id": "bigint", "amount": "int"}
DIM_TYPES = {"id": "bigint", "note": "string"}


def test_a_join_on_the_fact_key_indexes_each_column_once_and_stays_exact():
    (join,) = parse_joins([{"table": "details", "key": ["id"], "on": {"id": "id"},
                            "columns": ["note"], "kind": "left"}])
    t = JoinTables(JoinPlan.of([join], ["id"], list(FACT_TYPES), [["bigint"]]), FACT_TYPES,
                   [DIM_TYPES], 8)
    assert t.index_schemas[0].names == ["id", "amount", "vnode"]  # the key, then the facts
    store = Store(t)
    first = store.apply([Signed(1, {"id": 1, "amount": 5}), Signed(1, {"id": 2, "amount": 7})],
                        [[Signed(1, {"id": 2, "note": "two"})]])
    assert sorted((s, r["id"], r["note"]) for s, r in first) == [(1, 1, None), (1, 2, "two")]
    late = store.apply([], [[Signed(1, {"id": 1, "note": "one"})]])  # reached by the index
    assert sorted((s, r["id"], r["note"]) for s, r in late) == [(-1, 1, None), (1, 1, "one")]
    gone = store.apply([Signed(-1, {"id": 2, "amount": 7})], [[]])
    assert [(s, r["id"]) for s, r in gone] == [(-1, 2)]
    assert pa.Table.from_pylist(list(store.index[0].values()), t.index_schemas[0]).num_rows == 1
