"""The crash matrix of the aggregate path: a real barrier process (the reliability suite's light
child, `run_barrier` with the kill hook) SIGKILLed at every commit boundary of an aggregate
barrier, in its bulk barrier and in change-feed barriers; the tables hold exactly the commits
before the boundary (by their app transactions), and the next barrier, in this process, lands
the MV exactly on Spark's GROUP BY (never a row lost or counted twice). Each change-feed kill
starts between two checkpoints of the group state (this process's barriers skipped its
commit), so the killed child replays the feed into the state first."""

from __future__ import annotations

import random

import pytest

from backfill_assets.aggregate.projection import projection_of
from backfill_assets.aggregate.store import INPUT, MV, STATE, AggregateStore
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.step.preflight import checked_upstream
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact, extremes_batch
from tests.reliability import harness as H

# the boundaries, and which tables hold the killed barrier at each: (must, may). The tables'
# commits run side by side (aggregate/barrier.py `_commit`), so at a boundary inside or after
# one of them the others may have landed or not; the progress waits for all
_TABLES = (STATE, INPUT, MV)


def _side(done: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return ((done,) if done else ()), tuple(t for t in _TABLES if t != done)


HELD = {"before_write": ((), ()), "agg_state_dv_file_written": _side(None),
        "after_agg_state_commit": _side(STATE), "after_agg_input_commit": _side(INPUT),
        "mv_dv_file_written": _side(None), "after_mv_commit": _side(MV),
        "before_progress_commit": (_TABLES, ()), "after_progress_commit": (_TABLES, ())}


def held_as_expected(point: str, held: set[str], phases: tuple[str, ...]) -> bool:
    """Whether the tables holding the killed barrier are what the boundary allows."""
    must, may = HELD[point]
    return set(must) & set(phases) <= held <= (set(must) | set(may)) & set(phases)


BULK_KILLS = ["after_agg_state_commit", "after_agg_input_commit", "after_mv_commit"]
APPLY_KILLS = ["before_write", "agg_state_dv_file_written", "after_agg_state_commit",
               "after_agg_input_commit", "mv_dv_file_written", "after_mv_commit",
               "before_progress_commit", "after_progress_commit"]


def _store(spark, d, tables) -> AggregateStore:
    upstream = checked_upstream(tables, d, None)
    proj = projection_of(spark, d, upstream.schema, upstream.key_order)
    return AggregateStore(d.name, tables, proj.tables, d.vnode_count)


def _phases(spark, d, tables) -> tuple[str, ...]:
    return _store(spark, d, tables).phases


def _held(spark, d, tables, version: int) -> set[str]:
    store = _store(spark, d, tables)
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
        assert held_as_expected(point, held, _phases(spark, d, tables)), \
            f"{point}: tables holding v{version}: {held}, allowed {HELD[point]}"
        report = run_barrier(spark, d, tables, [0])
        assert report.v_new == version and report.finished
        # a barrier some table holds but the progress does not is completed, not redone
        assert bool(report.recovered) == (bool(held) and point != "after_progress_commit")
        assert_exact(spark, d, tables)
        if phase == "apply":  # the next kill starts between two checkpoints of the state
            _deferred_barriers(spark, d, tables, live)
    live.apply(live.random_batch(10))
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)


def _deferred_barriers(spark, d, tables, live) -> None:
    """Two barriers in this (warm) process: the second skips its state commit (the first may
    be a checkpoint), so the next killed child starts with the state table behind the MV and
    the progress, and replays the change feed into it (aggregate/checkpoint.py)."""
    for _ in range(2):
        live.apply(live.random_batch(5))
        report = run_barrier(spark, d, tables, [0])
    assert report.extra.get("state_checkpoint") is False, report.extra
    assert _store(spark, d, tables).txn_version(STATE, range(d.vnode_count)) < report.v_new
    assert_exact(spark, d, tables)
