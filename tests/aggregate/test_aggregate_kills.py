"""The crash matrix of the aggregate path: a real barrier process (the reliability suite's light
child, `run_barrier` with the kill hook) SIGKILLed at every commit boundary of an aggregate
barrier, in its bulk barrier and in change-feed barriers; the tables hold exactly the commits
before the boundary (by their app transactions), and the next barrier, in this process, lands
the MV exactly on Spark's GROUP BY (never a row lost or counted twice)."""

from __future__ import annotations

import random

import pytest

from backfill_assets.aggregate.projection import projection_of
from backfill_assets.aggregate.store import INPUT, MV, STATE, AggregateStore
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.step.preflight import checked_upstream
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact, extremes_batch
from tests.reliability import harness as H

# the boundaries in commit order, and which tables hold the killed barrier at each
HELD = {"before_write": (), "agg_state_dv_file_written": (),
        "after_agg_state_commit": (STATE,), "after_agg_input_commit": (STATE, INPUT),
        "mv_dv_file_written": (STATE, INPUT), "after_mv_commit": (STATE, INPUT, MV),
        "before_progress_commit": (STATE, INPUT, MV),
        "after_progress_commit": (STATE, INPUT, MV)}
BULK_KILLS = ["after_agg_state_commit", "after_agg_input_commit", "after_mv_commit"]
APPLY_KILLS = ["before_write", "agg_state_dv_file_written", "after_agg_state_commit",
               "after_agg_input_commit", "mv_dv_file_written", "after_mv_commit",
               "before_progress_commit", "after_progress_commit"]


def _held(spark, d, tables, version: int) -> set[str]:
    upstream = checked_upstream(tables, d, None)
    proj = projection_of(spark, d, upstream.schema, upstream.key_order)
    store = AggregateStore(d.name, tables, proj.tables, d.vnode_count)
    return {p for p in store.phases if store.txn_version(p, range(d.vnode_count)) == version}


def _killed(warehouse: str, raw: dict, point: str) -> None:
    child = H.light_backfill(H.light_args(warehouse, raw, None, [0], kill_at=point))
    assert child.killed, f"{point}: the child was not killed:\n{child.output[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["bulk", "apply"])
def test_a_kill_at_every_commit_boundary_neither_loses_nor_double_counts(spark, warehouse,
                                                                         phase):
    rng = random.Random(7)
    live = H.orders(warehouse, 7)
    live.create(rows=200)
    kills = BULK_KILLS if phase == "bulk" else APPLY_KILLS
    tops: list[int] = []
    for n, point in enumerate(kills):
        raw = aggregate_raw(f"agg_kill_{phase}_{n}" if phase == "bulk" else "agg_kill", live.uri)
        d, tables = H.definition(raw), H.tables_of(warehouse, raw)
        if phase == "apply" and n == 0:
            run_barrier(spark, d, tables, [0])
        live.apply(extremes_batch(live, rng, tops))
        version = H.latest(live.uri)
        _killed(warehouse, raw, point)
        held = _held(spark, d, tables, version)
        want = set(HELD[point])
        assert held == want, f"{point}: tables holding v{version}: {held}, expected {want}"
        report = run_barrier(spark, d, tables, [0])
        assert report.v_new == version and report.finished
        # a barrier some table holds but the progress does not is completed, not redone
        assert bool(report.recovered) == (bool(want) and point != "after_progress_commit")
        assert_exact(spark, d, tables)
    live.apply(live.random_batch(10))
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
