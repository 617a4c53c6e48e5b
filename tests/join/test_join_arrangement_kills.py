"""The crash matrix of a join MV in arrangement mode: a real step process (the reliability
suite's light child, `run_barrier` with the kill hook) SIGKILLed at every commit boundary of a
step while both feeds move under the backfill; the tables hold exactly the commits before the
boundary (by the step number and dimension version of their app transactions), and the next
step, in this process, completes the killed one from its recorded inputs and lands the MV on
Spark's join of the covered facts (nothing lost or doubled); the backfill then finishes
exact."""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.join.store import PROGRESS, Pair, held_by
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.join.test_join_kills import HELD, _held
from tests.reliability import harness as H

pytestmark = pytest.mark.spark

# the deletion-vector points last: by then the positions cover enough facts that a step's
# fact changes delete held rows of the index and the MV
ORDER = sorted(HELD, key=lambda point: point.endswith("_dv_file_written"))


# the default run (CI time) kills at one boundary, between the state commits (each kill is a
# fresh process's backfill); the variant at every one, the snapshot path's matrix
# (test_join_kills) at every one too
SOME = ["after_join_index_0_commit"]


@pytest.mark.slow
def test_a_kill_at_some_step_boundaries_neither_loses_nor_doubles(spark, warehouse):
    _kill_matrix(spark, warehouse, [p for p in ORDER if p in SOME])


@pytest.mark.variant
def test_a_kill_at_every_step_boundary_neither_loses_nor_doubles(spark, warehouse):
    _kill_matrix(spark, warehouse, ORDER)


def _kill_matrix(spark, warehouse, points: list[str]) -> None:
    rng = random.Random(12)
    live = H.orders(warehouse, 12)
    live.create(rows=160)  # 20 rows per vnode: the matrix runs before any vnode finishes
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 12))
    raw = join_raw("join_arr_kill", live.uri, "left", mode="arrangement", chunk_size=1)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    for _ in range(6):  # covered facts enough for a step's changes to rewrite held rows
        run_barrier(spark, d, tables, [0])
    for point in points:
        live.apply(live.random_batch(8))
        dim.random_dml()
        done = held_by(tables.progress, tables, d.name, PROGRESS, 8, 1)
        step = Pair(done.fact + 1, (H.latest(dim.uri),))
        child = H.light_backfill(H.light_args(warehouse, raw, None, [0], kill_at=point))
        assert child.killed, f"{point}: the child was not killed:\n{child.output[-3000:]}"
        held = _held(tables, d.name, step)
        assert held == set(HELD[point]), f"{point}: tables holding {step}: {held}"
        report = run_barrier(spark, d, tables, [0])
        assert bool(report.recovered) == (bool(HELD[point]) and point != "after_progress_commit")
        assert not report.finished, "the backfill finished before the matrix did"
        assert_exact(spark, d, tables)
    for _ in range(30):
        live.apply(live.random_batch(5))
        dim.random_dml()
        if run_barrier(spark, d, tables, [0]).finished:
            break
    else:
        raise AssertionError("the backfill did not finish in 30 steps after the matrix")
    assert_exact(spark, d, tables)
