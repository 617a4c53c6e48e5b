"""Runtime controls (rate limit, pause, resume, chunk size) and the no-shuffle layout rule."""

from __future__ import annotations

import random
import time

import dagster as dg
import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import InvalidControl, RescaleRefused
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.mv.controls import Controls, read_controls, update_controls
from backfill_assets.mv.owned_tables import MVTables
from jobs.controls import build_controls_job
from resources.settings import load_settings
from resources.warehouse import warehouse_resource
from tests.support import LiveUpstream, assert_verified, simple_mv, simple_row, simple_spec

VNODES = 8


@pytest.fixture
def backfill(spark, warehouse):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(11),
                        simple_row, lambda rng: rng.randint(1, 5000))
    live.create(rows=240)
    d = simple_mv(VNODES, chunk_size=6)
    return live, d, MVTables.under(warehouse, d.name, "orders")


def test_rate_limit_bounds_rows_per_second(spark, backfill):
    """A rate limit bounds the rows read per second over time (barrier/pacing.py): the first
    step after the change reads one second's worth, later ones what came due meanwhile."""
    live, d, tables = backfill
    update_controls(tables, rate_limit=16)
    started, rows = time.time(), 0
    for n in range(2):
        live.apply(live.random_batch(4))
        report = run_barrier(spark, d, tables, list(range(VNODES)))
        rows += report.snapshot_rows
        assert 0 < report.snapshot_rows and rows <= 16 * (time.time() - started) + 16
        if n == 0:
            assert report.snapshot_rows <= 16 and report.chunk_limit == 2  # 16 / 8 vnodes
    assert_verified(spark, d, tables)


def test_pause_stops_snapshot_while_changes_flow_then_resume(spark, backfill):
    live, d, tables = backfill
    vnodes = list(range(VNODES))
    first = run_barrier(spark, d, tables, vnodes)
    while not any(isinstance(p, Completed) for p in first.progress.values()):
        first = run_barrier(spark, d, tables, vnodes)  # until some vnode is finished
    assert any(isinstance(p, InProgress) for p in first.progress.values())
    update_controls(tables, rate_limit=0)
    live.apply(live.random_batch(30))
    paused = run_barrier(spark, d, tables, vnodes)
    assert paused.paused and paused.snapshot_rows == 0 and paused.forwarded_rows > 0
    assert paused.progress == first.progress  # positions and row counts did not move
    assert_verified(spark, d, tables)

    update_controls(tables, rate_limit="unlimited", chunk_size=3)
    resumed = run_barrier(spark, d, tables, vnodes)
    assert resumed.chunk_limit == 3 and 0 < resumed.snapshot_rows <= 3 * VNODES
    for v in vnodes:  # continued from the same position, not from scratch
        before, after = first.progress[v], resumed.progress[v]
        if isinstance(before, InProgress):
            assert after.row_count > before.row_count or isinstance(after, Completed)
            assert after.current_pos > before.current_pos  # single bigint key
    assert_verified(spark, d, tables)


def test_set_controls_job_typed_config_and_bad_values(tmp_path, warehouse, monkeypatch):
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = simple_mv(VNODES)
    job = build_controls_job(d, settings)
    tables = MVTables.under(warehouse, d.name, d.upstream)
    instance = dg.DagsterInstance.ephemeral()
    resources = {"warehouse": warehouse_resource(settings)}

    def run(**config):
        return job.execute_in_process(run_config={"ops": {"set_controls": {"config": config}}},
                                      instance=instance, resources=resources,
                                      raise_on_error=False)

    result = run(snapshot="pause", chunk_size=60)  # ints as ints, pause as a choice
    assert result.success and read_controls(tables) == Controls(chunk_size=60, rate_limit=0)
    output = next(e for e in result.all_events if e.event_type_value == "STEP_OUTPUT")
    meta = output.event_specific_data.metadata
    assert meta["paused"].value is True and meta["chunk_size"].value == 60
    seen = next(e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION")
    observed = seen.event_specific_data.asset_observation  # on the asset before any barrier
    assert observed.asset_key == dg.AssetKey("downstream_mv")
    assert observed.metadata["paused"].value is True
    assert observed.metadata["controls_chunk_size"].value == 60

    assert run(snapshot="resume", rate_limit=500).success
    assert read_controls(tables) == Controls(chunk_size=60, rate_limit=500)
    assert run(reset_chunk_size=True).success
    assert read_controls(tables) == Controls(chunk_size=None, rate_limit=500)
    for bad, words in (({"snapshot": "pause", "rate_limit": 100}, "contradict"),
                       ({"chunk_size": 0}, "whole number >= 1"),
                       ({"rate_limit": -5}, "rows per second >= 0")):
        failed = run(**bad)
        assert not failed.success
        failure = failed.failure_data_for_node("set_controls").error
        # the named error and what to do lead the step's failure (named_errors.named_first)
        assert failure.message.split(": ", 1)[1].startswith("InvalidControl: "), failure.message
        error = failure.cause
        assert error.cls_name == "InvalidControl" and words in error.message, error.message
    assert read_controls(tables) == Controls(chunk_size=None, rate_limit=500)  # nothing written
    with pytest.raises(dg.DagsterInvalidConfigError, match="snapshot"):
        run(snapshot="stop")  # not a choice: refused before the run starts
    with pytest.raises(InvalidControl, match="not a whole number"):
        update_controls(tables, chunk_size="lots")


def test_no_shuffle_refuses_to_rescale_while_in_progress(spark, warehouse):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(12),
                        simple_row, lambda rng: rng.randint(1, 5000))
    live.create(rows=120)
    d = simple_mv(VNODES, mode="no_shuffle", chunk_size=10)
    tables = MVTables.under(warehouse, d.name, "orders")
    run_barrier(spark, d, tables, list(range(VNODES)))
    with pytest.raises(RescaleRefused, match="cannot change until it finishes"):
        run_barrier(spark, d, tables, [0, 1, 2, 3])
    while not run_barrier(spark, d, tables, list(range(VNODES))).finished:
        pass
    live.apply(live.random_batch(10))
    run_barrier(spark, d, tables, [0, 1, 2, 3])  # finished: any ranges from now on
    run_barrier(spark, d, tables, [4, 5, 6, 7])
    assert_verified(spark, d, tables)
