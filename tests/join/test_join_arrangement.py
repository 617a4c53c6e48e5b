"""Join MVs in arrangement and no_shuffle modes: per-vnode positions (or a shared one) move
over the fact table a chunk per step while both sides change under them. After every step
the MV equals Spark SQL's join of the fact rows the positions cover (verify/join_oracle.py)
with the dimension at its recorded version: a dimension change reaches only the fact rows at
or below their vnode's position, a fact change only where the positions cover its key. The
MV reports backfilling (progress, `vnodes_finished`) until every fact vnode is finished, then
it is maintained like a snapshot-mode join MV."""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import figures, run_barrier
from backfill_assets.core.figures import BACKFILLING, MAINTAINING
from backfill_assets.join import barrier_due
from backfill_assets.mv.controls import Controls
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _backfill(spark, d, tables, live, dim, rng, *, steps: int = 30) -> list:
    """Steps under random DML on both sides (a step where only one side moved, one where
    neither did), each checked against the oracle, until every fact vnode is finished."""
    reports = []
    for n in range(steps):
        if n % 3 != 1:
            live.apply(live.random_batch(6))
        if n % 3 != 2 and n % 4 != 3:
            dim.random_dml()
        report = run_barrier(spark, d, tables, list(range(8)))
        reports.append(report)
        assert report.extra["join_path"] == "arrangement"
        assert report.v_new == H.latest(live.uri)
        assert report.extra["dimension_versions"] == [H.latest(dim.uri)]
        assert_exact(spark, d, tables)
        if report.finished:
            return reports
    raise AssertionError(f"not finished after {steps} steps")


@pytest.mark.parametrize("mode,kind", [
    pytest.param("arrangement", "left", marks=pytest.mark.variant),
    pytest.param("arrangement", "inner", marks=pytest.mark.variant),
    pytest.param("no_shuffle", "left", marks=pytest.mark.variant)])
def test_join_mv_in_arrangement_equals_spark_join_of_the_covered_facts(spark, warehouse,
                                                                      mode, kind):
    rng = random.Random(60)
    live = H.orders(warehouse, 60)
    live.create(rows=120)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 14))
    raw = join_raw(f"joined_{mode}_{kind}", live.uri, kind, mode=mode, chunk_size=5)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    first = run_barrier(spark, d, tables, [0])
    assert not first.finished and first.extra["vnodes_finished"] < 8
    assert first.snapshot_rows == (5 if mode == "no_shuffle" else 40)
    state = figures(d, tables, Controls(), first.v_new)
    assert state.state == BACKFILLING and state.vnodes_finished < 8
    assert_exact(spark, d, tables)
    reports = _backfill(spark, d, tables, live, dim, rng)
    assert any(r.extra["fact_changes"] for r in reports)  # changes below the positions
    assert any(r.extra["dimension_changes"] and r.extra["facts_reached"] for r in reports)
    assert figures(d, tables, Controls(), reports[-1].v_new).state == MAINTAINING
    for n in range(3):  # maintained: both feeds, and a step where only the dimension moved
        if n != 1:
            live.apply(live.random_batch(8))
        dim.random_dml()
        assert barrier_due(d, tables)
        report = run_barrier(spark, d, tables, [0])
        assert report.finished and report.extra["chunk_rows"] == 0
        assert_exact(spark, d, tables)
    assert not barrier_due(d, tables)
    idle = run_barrier(spark, d, tables, [0])
    assert idle.v_new == report.v_new and not barrier_due(d, tables)
    assert_exact(spark, d, tables)


def test_an_aggregate_over_the_join_in_arrangement_mode(spark, warehouse):
    """Revenue per region while the backfill moves: a dimension change moves only covered
    orders between groups."""
    rng = random.Random(61)
    live = H.orders(warehouse, 61)
    live.create(rows=100)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 15))
    raw = join_raw("joined_agg_arr", live.uri, "left", mode="arrangement", chunk_size=6)
    del raw["columns"]
    raw |= {"group_by": ["region"],
            "aggregates": {"revenue": "sum(amount)", "orders": "count(*)",
                           "top": "max(amount)", "tiers": "sum(tier_level)"}}
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
    _backfill(spark, d, tables, live, dim, rng)


class SparkFacts:
    """A fact table created and changed only through Delta-Spark SQL (MERGE upserts that
    move join keys, UPDATE, DELETE), deletion vectors on: a foreign writer on the fact side."""

    def __init__(self, spark, uri: str, rng: random.Random):
        self.spark, self.uri, self.rng, self.next_id = spark, uri, rng, 0
        spark.sql(f"CREATE TABLE delta.`{uri}` (id BIGINT, name STRING, amount DECIMAL(12,2), "
                  "qty INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
                  "delta.enableDeletionVectors = true)")

    def _rows(self, ids) -> str:
        return ", ".join(f"({i}, 'n{i % 7}', {self.rng.randint(1, 9999) / 100:.2f}, "
                         f"{self.rng.randint(0, 20)})" for i in ids)

    def insert(self, n: int) -> None:
        ids = range(self.next_id, self.next_id + n)
        self.next_id += n
        self.spark.sql(f"INSERT INTO delta.`{self.uri}` VALUES {self._rows(ids)}")

    def random_dml(self) -> None:
        """A MERGE of existing and new ids (join keys move), an UPDATE and a DELETE."""
        ids = [self.rng.randrange(self.next_id) for _ in range(3)] + [self.next_id]
        self.next_id += 1
        self.spark.sql(f"MERGE INTO delta.`{self.uri}` t USING (SELECT * FROM VALUES "
                       f"{self._rows(sorted(set(ids)))} AS s(id, name, amount, qty)) s "
                       "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
                       "WHEN NOT MATCHED THEN INSERT *")
        self.spark.sql(f"UPDATE delta.`{self.uri}` SET qty = (qty + 5) % 21 "
                       f"WHERE id = {self.rng.randrange(self.next_id)}")
        self.spark.sql(f"DELETE FROM delta.`{self.uri}` WHERE id = "
                       f"{self.rng.randrange(self.next_id)}")


def test_delta_spark_writers_on_both_sides_in_arrangement_mode(spark, warehouse):
    """Both tables written only by Delta-Spark (MERGE, UPDATE, DELETE with deletion
    vectors) while the arrangement backfill moves: exact at every step, then maintained."""
    rng = random.Random(62)
    facts = SparkFacts(spark, f"{warehouse}/facts", rng)
    facts.insert(90)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 14))
    raw = join_raw("joined_spark_arr", facts.uri, "left", mode="arrangement", chunk_size=5)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    report = run_barrier(spark, d, tables, [0])
    for _ in range(12):
        assert_exact(spark, d, tables)
        if report.finished:
            break
        facts.random_dml()
        dim.random_dml()
        report = run_barrier(spark, d, tables, [0])
    assert report.finished
    facts.random_dml()
    dim.random_dml()
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
