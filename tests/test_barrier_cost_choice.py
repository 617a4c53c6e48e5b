"""Choose by cost (barrier/by_cost.py): a barrier over finished vnodes re-snapshots them when
re-reading costs less than applying its changes (by the unit costs the MV measured, or forced
by the `barrier_choice` control), lands exactly where applying would have (the oracle, row for
row, and the same MV rows as a twin MV that applied the changes), records the choice in its
metadata, and recovers from a crash in the middle of the re-snapshot. Real Spark and Delta."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from backfill_assets.barrier.runner import figures, run_barrier
from backfill_assets.core.cost_choice import APPLY, RESNAPSHOT, UnitCost, UnitCosts
from backfill_assets.mv.controls import Controls, write_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.unit_costs import read_unit_costs, unit_costs_uri
from backfill_assets.storage import write_json
from backfill_assets.wiring.metadata import barrier_metadata
from tests.reliability import harness as H
from tests.support import LiveUpstream, assert_verified, simple_mv, simple_row, simple_spec

VNODES = 8
ALL = list(range(VNODES))
# what an MV whose change rows cost a lot to apply measured: with these costs 80 of 160 rows
# changed re-read (applying would cost more than re-reading), 4 apply
DEAR_CHANGES = UnitCosts(UnitCost(0.05, 3), UnitCost(1e-4, 3))


def _upstream(warehouse: str, seed: int, rows: int = 160) -> LiveUpstream:
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(seed),
                        simple_row, lambda rng: rng.randint(1, 10_000))
    live.create(rows=rows)
    return live


def _finished(spark, warehouse: str, mode: str = "snapshot", name: str | None = None):
    d = simple_mv(VNODES, mode=mode, chunk_size=40)
    d = replace(d, name=name) if name else d
    tables = MVTables.under(warehouse, d.name, "orders")
    while not run_barrier(spark, d, tables, ALL).finished:
        pass
    return d, tables


def _changed(live: LiveUpstream, changes: int, per_version: int = 15) -> int:
    """`changes` random changes in versions of at most `per_version` (one barrier will carry
    them all: a version of LiveUpstream's batches holds each key once at most)."""
    version = -1
    while changes > 0:
        version = live.apply(live.random_batch(min(per_version, changes)))
        changes -= per_version
    return version


def _plant(tables: MVTables, costs: UnitCosts) -> None:
    """What this MV's earlier barriers measured (the document the barriers keep)."""
    write_json(unit_costs_uri(tables), costs.to_json(), tables.storage_options)


def _rows(uri: str) -> Counter:
    table = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t").read_all()
    table = pa.table(table)
    return Counter(tuple(sorted(r.items())) for r in table.to_pylist())


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_a_large_change_set_resnapshots_at_the_barriers_version(spark, warehouse, mode):
    live = _upstream(warehouse, seed=61)
    d, tables = _finished(spark, warehouse, mode)
    _plant(tables, DEAR_CHANGES)
    version = _changed(live, 80)  # half the rows
    report = run_barrier(spark, d, tables, ALL, version=version)
    assert report.extra["barrier_choice"] == f"re-snapshot vnodes 0..{VNODES - 1}"
    assert report.extra["barrier_choice_control"] == "auto"
    assert report.extra["estimated_change_rows"] > 80
    assert report.extra["estimated_vnode_rows"] == sum(
        n or 0 for n in DeltaTable(live.uri, version=version).get_add_actions(
            flatten=True).column("num_records").to_pylist())
    reason = report.extra["barrier_choice_reason"]
    assert "applying ~" in reason and "re-reading ~" in reason and f"at v{version}" in reason
    assert report.v_new == version and report.finished
    assert set(report.versions.values()) == {version} and report.snapshot_rows > 0
    assert report.forwarded_rows == 0  # no change was applied: the vnodes were re-read
    assert_verified(spark, d, tables)
    assert read_unit_costs(tables) == DEAR_CHANGES  # 160 rows say nothing about a unit cost
    live.apply(live.random_batch(4))  # then an ordinary small barrier applies again
    small = run_barrier(spark, d, tables, ALL)
    assert small.extra["barrier_choice"] == "apply changes" and small.forwarded_rows > 0
    assert_verified(spark, d, tables)


@pytest.mark.spark
def test_a_small_change_set_applies_and_the_metadata_says_why(spark, warehouse):
    live = _upstream(warehouse, seed=62)
    d, tables = _finished(spark, warehouse)
    live.apply(live.random_batch(6))
    report = run_barrier(spark, d, tables, ALL)
    extra = report.extra
    assert extra["barrier_choice"] == "apply changes" and report.forwarded_rows > 0
    assert "estimated_vnode_rows" not in extra  # not needed: below a re-snapshot's fixed cost
    assert "vnode rows not estimated" in extra["barrier_choice_reason"]
    assert extra["apply_cost_samples"] == 0 and extra["apply_us_per_row"] > 0
    meta = barrier_metadata(report, figures(d, tables, Controls(), report.v_new), Controls(), {})
    assert meta["barrier_choice"].text == "apply changes"
    assert meta["estimated_change_rows"].value == extra["estimated_change_rows"]
    assert meta["barrier_choice_reason"].text.startswith("re-reading would not cost")
    assert_verified(spark, d, tables)


@pytest.mark.spark
def test_forced_either_way_both_land_the_same_rows(spark, warehouse):
    """Two MVs over one upstream, one forced to apply, one to re-snapshot (the control): the
    same rows, both verified; an idle barrier and a backfill in progress make no choice."""
    live = _upstream(warehouse, seed=63)
    twins = {}
    for choice in (APPLY, RESNAPSHOT):
        d, tables = _finished(spark, warehouse, name=f"mv_{choice}")
        write_controls(tables, Controls(barrier_choice=choice))
        twins[choice] = (d, tables)
    version = _changed(live, 30)
    for choice, (d, tables) in twins.items():
        report = run_barrier(spark, d, tables, ALL, version=version)
        assert report.extra["barrier_choice_control"] == choice
        assert report.extra["barrier_choice_reason"].startswith(
            f"forced by barrier_choice={choice}")
        assert (report.extra["barrier_choice"] != "apply changes") == (choice == RESNAPSHOT)
        assert "estimated_vnode_rows" in report.extra  # a forced choice records both
        assert_verified(spark, d, tables)
        idle = run_barrier(spark, d, tables, ALL, version=version)
        assert "barrier_choice" not in idle.extra
    assert _rows(twins[APPLY][1].mv) == _rows(twins[RESNAPSHOT][1].mv)


@pytest.mark.spark
def test_a_backfill_in_progress_keeps_its_path(spark, warehouse):
    live = _upstream(warehouse, seed=64)
    d = simple_mv(VNODES, mode="arrangement", chunk_size=3)
    tables = MVTables.under(warehouse, d.name, "orders")
    write_controls(tables, Controls(barrier_choice=RESNAPSHOT))
    run_barrier(spark, d, tables, ALL)
    live.apply(live.random_batch(20))
    report = run_barrier(spark, d, tables, ALL)
    assert not report.finished and "barrier_choice" not in report.extra
    assert_verified(spark, d, tables)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [pytest.param("after_mv_commit@2", marks=pytest.mark.variant),
                                     "mv_dv_file_written@1"])
def test_a_crash_mid_resnapshot_recovers(spark, warehouse, kill_at):
    """SIGKILL a real process inside a re-snapshot of several slices (after the second slice's
    MV commit, before its progress; or inside the first slice's MV commit), then rerun the
    barrier: the MV is the oracle's at the barrier's version, nothing lost or doubled."""
    live = _upstream(warehouse, seed=65, rows=240)
    raw = H.mv_raw("mv_crash", "snapshot", 40, live.uri, vnode_count=VNODES)
    raw["slice_rows"] = 50  # several slices: several re-snapshot commits
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    while not run_barrier(spark, d, tables, ALL).finished:
        pass
    write_controls(tables, Controls(barrier_choice=RESNAPSHOT))
    version = _changed(live, 60)
    crashed = H.light_backfill(H.light_args(warehouse, raw, version, ALL, kill_at=kill_at))
    assert crashed.killed, crashed.output[-2000:]
    costs = read_unit_costs(tables)
    report = run_barrier(spark, d, tables, ALL, version=version)
    assert report.v_new == version and report.finished
    assert set(report.versions.values()) == {version}
    if kill_at.startswith("after_mv_commit"):  # two slices landed: only the rest is re-read
        assert report.recovered and report.extra["resnapshot_vnodes"] < VNODES
    assert read_unit_costs(tables) == costs  # a rerun's time is no measure of the path
    assert_verified(spark, d, tables)
    keys = [r["id"] for r in pa.table(QueryBuilder().register("t", DeltaTable(tables.mv))
                                      .execute("SELECT id FROM t").read_all()).to_pylist()]
    assert len(keys) == len(set(keys))
