"""The join MV's bulk build runs by tasks here (an aggregate: join/bulk_tasks.py) or in Spark
(a row MV, join/bulk.py); either way its state tables must
be the ones the barrier's algebra gives for every row as +1 over empty state
(`JoinTables.apply`, itself tested against a pure reference and Spark's JOIN), row for row
and vnode for vnode (Spark's hash of a key must be the driver's, or a later keyed read would
look in the wrong vnode), and its MV Spark's join (verify_join). A dimension holding one key
twice is refused by name."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import DimensionKeyNotUnique
from backfill_assets.join.barrier import open_barrier
from backfill_assets.join.store import dimension_phase, index_phase
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import open_if_exists, read_rows
from backfill_assets.storage import key_cache, objects
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.reliability import harness as H

pytestmark = pytest.mark.spark


def _plus(uri: str, version: int, schema: pa.Schema) -> pa.Table:
    """Every row of the table at ``version`` as +1 rows of a change schema."""
    rows = read_rows(open_if_exists(uri, {}, version), None, schema.names[1:])
    rows = rows.add_column(0, SIGN, pa.array([1] * rows.num_rows, pa.int8()))
    return rows.cast(schema)


def _sorted(rows: pa.Table, schema: pa.Schema) -> list[dict]:
    rows = rows.select(schema.names).cast(schema)
    return rows.sort_by([(n, "ascending") for n in schema.names]).to_pylist()


@pytest.mark.parametrize("kind", ["left", "inner"])
def test_the_spark_bulk_build_writes_the_state_the_algebra_gives(spark, warehouse, kind):
    live, dim = _tables(spark, warehouse, 60)
    raw = join_raw(f"bulk_{kind}", live.uri, kind)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    report = run_barrier(spark, d, tables, [0])
    assert report.extra["join_path"] == "bulk" and report.extra["bulk_path"] == "spark"
    assert set(report.extra["bulk_seconds"]) >= {"read_facts", index_phase(0), "mv"}
    assert_exact(spark, d, tables)
    _assert_state_of_apply(spark, d, tables, live, dim)


@pytest.mark.parametrize("kind", ["left", "inner"])
def test_the_task_bulk_build_writes_the_state_the_algebra_gives(spark, warehouse, kind):
    """An aggregate over the join (no kept input): read, joined, indexed and aggregated by
    tasks here, nothing through the JVM; a filter and a computed column over joined ones."""
    live, dim = _tables(spark, warehouse, 62)
    raw = join_raw(f"tasks_{kind}", live.uri, kind)
    del raw["columns"], raw["computed"]  # concat / coalesce: not compiled to Arrow
    raw |= {"computed": [{"name": "gross", "expr": "amount * qty"}], "group_by": ["region"],
            "aggregates": {"revenue": "sum(amount)", "orders": "count(*)",
                           "avg_amount": "avg(amount)", "tiers": "sum(tier_level)",
                           "regions": "count(region)", "grossed": "sum(gross)"}}
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    report = run_barrier(spark, d, tables, [0])
    assert report.extra["join_path"] == "bulk" and report.extra["bulk_path"] == "tasks"
    assert assert_exact(spark, d, tables) > 0
    _assert_state_of_apply(spark, d, tables, live, dim)
    _assert_keys_handed_over(spark, d, tables)
    live.apply(live.random_batch(10))
    dim.random_dml()
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)


def _tables(spark, warehouse: str, seed: int):
    """The fact table (90 orders) and a tiers dimension that some facts meet no row of."""
    rng = random.Random(seed)
    live = H.orders(warehouse, seed)
    live.create(rows=90)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 13))  # qty runs 0..20: some facts meet no row
    dim.random_dml()
    return live, dim


def _assert_state_of_apply(spark, d, tables, live, dim) -> None:
    """The bulk's state tables are `apply`'s over empty state, row for row, vnode for vnode."""
    barrier, pair = open_barrier(spark, d, tables, None, lambda _: None, Controls())
    store, jt = barrier.store, barrier.store.jt
    want = jt.apply([s.empty_table() for s in jt.index_schemas],
                    [s.empty_table() for s in jt.dimension_schemas],
                    _plus(live.uri, pair.fact, jt.fact_change_schema),
                    [_plus(dim.uri, pair.dimensions[0], jt.dimension_change_schemas[0])])
    expected = {index_phase(0): want.index_after[0],
                dimension_phase(0): want.dimension_upserts[0]}
    for phase, rows in expected.items():
        table = store.table(phase)
        held = read_rows(open_if_exists(table.uri, {}), None)
        assert rows.num_rows > 0
        assert _sorted(held, table.schema) == _sorted(rows, table.schema), phase


def _assert_keys_handed_over(spark, d, tables) -> None:
    """The bulk handed each state file's keys (by the column its keyed commits find rows by)
    to the key cache, equal to the file's: the first barrier after it reads none back."""
    barrier, _ = open_barrier(spark, d, tables, None, lambda _: None, Controls())
    for phase in barrier.store.phases:
        snap, key = barrier.store.snapshot(phase), barrier.store.write_key(phase)
        assert snap.files, phase
        for f in snap.files:
            kept = key_cache.CACHE.kept(snap.uri, f.path, f.size, f.num_records, key)
            assert kept is not None, (phase, f.path)
            held = pq.read_table(objects.local_path(snap.file_uri(f.path)), columns=key) \
                .column(0).to_numpy()
            assert sorted(kept.sorted_keys.tolist()) == sorted(held.tolist()), phase
            assert kept.sorted_keys[np.argsort(kept.order)].tolist() == held.tolist(), phase


def test_a_dimension_key_held_twice_is_refused_before_any_table_is_written(spark, warehouse):
    live = H.orders(warehouse, 61)
    live.create(rows=20)
    dim = Dimension(spark, f"{warehouse}/tiers", random.Random(61))
    dim.insert(range(0, 5))
    spark.sql(f"INSERT INTO delta.`{dim.uri}` VALUES (3, 'north', 1)")  # a second row for 3
    raw = join_raw("bulk_twice", live.uri, "left")
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    with pytest.raises(DimensionKeyNotUnique, match="declared key"):
        run_barrier(spark, d, tables, [0])
    for uri in (tables.progress, tables.mv, f"{tables.join_state}/index_0"):
        assert open_if_exists(uri, {}) is None, f"{uri}: a refusal wrote a table"
