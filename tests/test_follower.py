"""The follower in-process: pause/resume while it runs, stop on request, a lost race survived.

The follower job runs in a thread (a real Dagster run on a real instance, the shared Spark
session) while the test writes the upstream and flips the controls, as a user would.
"""

from __future__ import annotations

import random
import threading

import dagster as dg
import pytest

from backfill_assets.barrier.follower import follow, stop_request
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.progress import Completed
from backfill_assets.mv.controls import update_controls
from backfill_assets.wiring.events import is_summary
from jobs.follower import build_follower_jobs
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource
from tests.support import (
    LiveUpstream,
    assert_verified,
    caught_up,
    progress_rows,
    simple_mv,
    simple_row,
    simple_spec,
    wait_for,
)

VNODES = 8


@pytest.fixture
def upstream(warehouse, monkeypatch):
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(5),
                        simple_row, lambda rng: rng.randint(1, 50_000))
    live.create(rows=160)
    return live


@pytest.mark.slow
@pytest.mark.spark
def test_pause_resume_and_stop_while_the_follower_runs(spark, upstream, dagster_home):
    settings = load_settings()
    d = simple_mv(VNODES, chunk_size=4)
    from resources.mv import mv_tables

    tables = mv_tables(d, settings)
    follower, stop_job, _ = build_follower_jobs(d, settings)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    instance = dg.DagsterInstance.local_temp(dagster_home)
    result: dict = {}

    def run() -> None:
        result["run"] = follower.execute_in_process(
            instance=instance, resources=resources, raise_on_error=False,
            run_config={"ops": {"follow_upstream": {"config": {"poll_seconds": 0.2}}}})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for("the first barrier", lambda: len(progress_rows(tables)) == VNODES)
    update_controls(tables, rate_limit=0)  # pause
    latest = upstream.apply(upstream.random_batch(10))
    wait_for(f"the paused follower to forward v{latest}",
             lambda: caught_up(tables, latest, VNODES))
    paused = progress_rows(tables)
    assert not all(r["backfill_finished"] for r in paused.values())
    for _ in range(2):
        latest = upstream.apply(upstream.random_batch(10))
        wait_for("forwarding while paused", lambda v=latest: caught_up(tables, v, VNODES))
        assert {v: r["row_count"] for v, r in progress_rows(tables).items()} == \
            {v: r["row_count"] for v, r in paused.items()}, "a paused follower read the snapshot"
    assert_verified(spark, d, tables)

    update_controls(tables, rate_limit="unlimited")  # resume
    wait_for("the backfill to finish", lambda: all(
        r["backfill_finished"] for r in progress_rows(tables).values()))
    latest = upstream.apply(upstream.random_batch(10))
    wait_for("maintenance", lambda: caught_up(tables, latest, VNODES))
    assert stop_job.execute_in_process(instance=instance, resources=resources).success
    thread.join(60)
    assert not thread.is_alive(), "the follower did not stop on request"
    run_result = result["run"]
    assert run_result.success
    assert run_result.output_for_node("follow_upstream") >= 4
    assert stop_request(tables) is not None
    assert_verified(spark, d, tables)
    # the last barrier's summary: a materialization of a finished vnode (wiring/events.py)
    summaries = [m for m in (
        getattr(e.dagster_event.event_specific_data, "materialization", None)
        for e in instance.all_logs(run_result.run_id)
        if e.dagster_event and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION")
        if m.asset_key.path == ["downstream_mv"] and is_summary(m.metadata)]
    meta = summaries[-1].metadata
    assert meta["lag_versions"].value == 0 and meta["barrier_version"].value == latest
    tags = instance.get_run_by_id(run_result.run_id).tags
    assert int(tags["follower/barriers"]) >= 4 and tags["backfill/vnodes"] == f"0-{VNODES - 1}"


@pytest.mark.spark
def test_follower_survives_a_run_that_wrote_its_vnodes_first(spark, upstream, warehouse):
    """A per-barrier run commits the follower's vnodes while the follower's barrier is planned:
    the follower's commit is fenced (ConcurrentBackfillRun, nothing written), it retries at the
    next barrier and the MV matches the oracle."""
    from backfill_assets.mv.owned_tables import MVTables

    d = simple_mv(VNODES, chunk_size=400)
    tables = MVTables.under(warehouse, d.name, "orders")
    vnodes = list(range(VNODES))
    run_barrier(spark, d, tables, vnodes)  # tables exist: the race below is a later barrier
    upstream.apply(upstream.random_batch(10))
    raced = []

    def rival_barrier(point: str) -> None:
        if point == "before_write" and not raced:
            raced.append(run_barrier(spark, d, tables, vnodes))

    records = []
    summary = follow(spark, d, tables, vnodes, on_barrier=records.append,
                     stop=threading.Event(), poll_seconds=0.1, max_barriers=1,
                     hook=rival_barrier, log=lambda _: None)
    assert raced and summary.conflicts == 1 and summary.barriers == 1
    assert all(isinstance(p, Completed) for p in records[-1].report.progress.values())
    assert_verified(spark, d, tables)
