"""The crash matrix of the join path: a real barrier process (the reliability suite's light
child, `run_barrier` with the kill hook) SIGKILLed at every commit boundary of a join barrier,
in its bulk barrier and in barriers where both feeds moved; the tables hold exactly the
commits before the boundary (by the version pair of their app transactions), and the next
barrier, in this process, lands the MV exactly on Spark's join (nothing lost or doubled)."""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.join.store import Pair, pair_of, recorded_pair
from backfill_assets.mv.owned_tables import open_if_exists
from backfill_assets.storage import TableVersion
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]

INDEX, DIM, MV = "join_index_0", "join_dimension_0", "mv"
# the boundaries in commit order, and which tables hold the killed barrier at each
HELD = {"before_write": (), "join_index_0_dv_file_written": (),
        "after_join_index_0_commit": (INDEX,),
        "after_join_dimension_0_commit": (INDEX, DIM),
        "mv_dv_file_written": (INDEX, DIM),
        "after_mv_commit": (INDEX, DIM, MV),
        "before_progress_commit": (INDEX, DIM, MV),
        "after_progress_commit": (INDEX, DIM, MV)}
BULK_KILLS = ["after_join_index_0_commit", "after_join_dimension_0_commit", "after_mv_commit"]
APPLY_KILLS = list(HELD)
# the default run (CI time): one boundary of each kind; "apply_all" (a variant) kills at every one;
# the Spark bulk ("bulk", a variant: the bulk by tasks is the default path) as "bulk_tasks" is
APPLY_SOME = ["join_index_0_dv_file_written", "after_join_dimension_0_commit", "after_mv_commit",
              "after_progress_commit"]


def _held(tables, name: str, pair: Pair) -> set[str]:
    """The tables whose app transactions hold ``pair``."""
    uris = {INDEX: f"{tables.join_state}/index_0",
            DIM: f"{tables.join_state}/dimension_0", MV: tables.mv}
    out = set()
    for phase, uri in uris.items():
        table = open_if_exists(uri, {})
        if table is not None and pair_of(TableVersion(uri, {}, table).txn_versions, name,
                                         phase, range(8), 1) == pair:
            out.add(phase)
    return out


def _raw(name: str, upstream: str, phase: str) -> dict:
    """The row MV over a left join; for "bulk_tasks" an aggregate over it, whose bulk runs
    by tasks here (join/bulk_tasks.py)."""
    raw = join_raw(name, upstream, "left")
    if phase == "bulk_tasks":
        del raw["columns"], raw["computed"]  # concat / coalesce: not compiled to Arrow
        raw |= {"group_by": ["region"],
                "aggregates": {"revenue": "sum(amount)", "orders": "count(*)"}}
    return raw


@pytest.mark.parametrize("phase", [pytest.param("bulk", marks=pytest.mark.variant), "bulk_tasks",
                                   "apply", pytest.param("apply_all", marks=pytest.mark.variant)])
def test_a_kill_at_every_commit_boundary_neither_loses_nor_doubles(spark, warehouse, phase):
    rng = random.Random(11)
    live = H.orders(warehouse, 11)
    live.create(rows=80)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 12))
    kills = {"bulk": BULK_KILLS, "bulk_tasks": BULK_KILLS, "apply": APPLY_SOME,
             "apply_all": APPLY_KILLS}[phase]
    bulk = phase.startswith("bulk")
    for n, point in enumerate(kills):
        name = f"join_kill_{phase}_{n}" if bulk else "join_kill"
        raw = _raw(name, live.uri, phase)
        d, tables = H.definition(raw), H.tables_of(warehouse, raw)
        if not bulk and n == 0:
            run_barrier(spark, d, tables, [0])
        live.apply(live.random_batch(8))
        dim.random_dml()
        pair = (H.latest(live.uri), H.latest(dim.uri))
        child = H.light_backfill(H.light_args(warehouse, raw, None, [0], kill_at=point))
        assert child.killed, f"{point}: the child was not killed:\n{child.output[-3000:]}"
        held = _held(tables, name, Pair(*pair[:1], pair[1:]))
        want = set(HELD[point])
        assert held == want, f"{point}: tables holding {pair}: {held}, expected {want}"
        report = run_barrier(spark, d, tables, [0])
        assert report.v_new == pair[0] and report.finished
        if bulk:
            assert report.extra["bulk_path"] == ("tasks" if phase == "bulk_tasks" else "spark")
        assert bool(report.recovered) == (bool(want) and point != "after_progress_commit")
        assert recorded_pair(name, tables, 1, 8) == Pair(*pair[:1], pair[1:])
        assert_exact(spark, d, tables)
    live.apply(live.random_batch(10))
    dim.random_dml()
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
