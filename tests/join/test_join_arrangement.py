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

pytestmark = pytest.mark.spark


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
    ("arrangement", "left"),
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
