"""Arrangement and no_shuffle backfills of an aggregate MV (aggregate/arrangement.py): random
DML on the live upstream while a backfill with a small chunk size runs over many barriers.
After every barrier the MV equals Spark's GROUP BY over exactly the rows each upstream vnode's
position covers (the oracle's positions), the MV stays "backfilling" until every vnode is
finished, and at the end it equals the whole GROUP BY. Kills at every commit boundary of a
step leave the tables holding exactly the commits before it, and the next barrier is exact."""

from __future__ import annotations

import random

import dagster as dg
import pytest

from backfill_assets.aggregate.arrangement import _Steps
from backfill_assets.aggregate.barrier import open_barrier
from backfill_assets.barrier.runner import figures, run_barrier
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.wiring.checks import progress_evaluation
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact, extremes_batch
from tests.aggregate.test_aggregate_kills import APPLY_KILLS, HELD, _killed, held_as_expected
from tests.reliability import harness as H

VNODES = 4


@pytest.mark.slow
@pytest.mark.parametrize("mode", [
    "arrangement", pytest.param("no_shuffle", marks=pytest.mark.variant)])  # CI time
def test_an_aggregate_backfill_by_positions_is_exact_at_every_barrier(spark, warehouse, mode):
    rng = random.Random(53)
    live = H.orders(warehouse, 53 if mode == "arrangement" else 54)
    live.create(rows=160)
    raw = aggregate_raw(f"agg_{mode}", live.uri, VNODES, mode=mode, chunk_size=12)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    partial, tops = 0, []
    for _ in range(40):
        live.apply(extremes_batch(live, rng, tops))
        report = run_barrier(spark, d, tables, list(range(VNODES)))
        assert report.extra["aggregate_path"] == "arrangement"
        states = vnode_states(tables)
        finished = report.finished
        assert finished == (len(states) == VNODES and set(states.values()) == {"finished"})
        assert_exact(spark, d, tables)
        if finished:
            break
        partial += 1
        assert report.extra["vnodes_finished"] < VNODES
        figs = figures(d, tables, Controls())  # a partial aggregate is never shown finished
        check = progress_evaluation(figs, {})
        assert figs.state == "backfilling" and figs.vnodes_finished < VNODES
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert finished and partial >= 3, f"{partial} partial barriers"
    for _ in range(2):  # finished: the change feed alone, every change visible
        live.apply(live.random_batch(10))
        run_barrier(spark, d, tables, list(range(VNODES)))
        assert assert_exact(spark, d, tables) > 10


def _held(spark, d, tables) -> tuple[set[str], tuple[str, ...]]:
    """The tables holding a step the progress does not, and the MV's tables."""
    b, _ = open_barrier(spark, d, tables, None, Controls(), lambda _: None)
    done = _Steps(b, None).done_step()
    return {p for p, v in b.txns().items() if v is not None and v > done}, b.store.phases


# the default run (CI time) kills at one boundary, between the state commits (each kill is a
# fresh process's backfill); the variant at every one (the snapshot path's matrix,
# test_aggregate_kills, runs every one too)
SOME = ["after_agg_state_commit"]


@pytest.mark.slow
def test_a_kill_at_some_commit_boundaries_of_a_step_neither_loses_nor_double_counts(
        spark, warehouse):
    _kill_matrix(spark, warehouse, SOME)


@pytest.mark.variant
def test_a_kill_at_every_commit_boundary_of_a_step_neither_loses_nor_double_counts(
        spark, warehouse):
    _kill_matrix(spark, warehouse, APPLY_KILLS)


def _kill_matrix(spark, warehouse, points: list[str]) -> None:
    rng = random.Random(11)
    live = H.orders(warehouse, 11)
    live.create(rows=200)
    raw = aggregate_raw("agg_arr_kill", live.uri, VNODES, mode="arrangement", chunk_size=2)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    tops: list[int] = []
    for point in points:
        live.apply(extremes_batch(live, rng, tops))
        _killed(warehouse, raw, point)
        held, phases = _held(spark, d, tables)
        if point == "after_progress_commit":
            assert held == set(), f"{point}: tables ahead of the progress: {held}"
        else:
            assert held_as_expected(point, held, phases), \
                f"{point}: tables ahead of the progress: {held}, allowed {HELD[point]}"
        report = run_barrier(spark, d, tables, [0])
        assert not report.finished, "the backfill finished before the matrix did"
        assert bool(report.recovered) == bool(held)
        assert_exact(spark, d, tables)
    while not run_barrier(spark, d, tables, [0]).finished:
        assert_exact(spark, d, tables)
    assert_exact(spark, d, tables)
