"""Runtime controls and follower stop requests on an object-store warehouse (moto's S3 server).

Why: the controls (pause / rate limit / chunk size) and the stop request are small documents
beside the MV's tables; a follower, a per-barrier run, the barrier sensor and the jobs that write
them may run on different machines, so on an `s3://` warehouse they must be objects in the store,
reached with the warehouse's storage options (the local-folder tests are test_controls.py,
test_follower.py and test_liveness.py). The option values are in variables of other names than
the AWS SDKs read by themselves, so nothing reaches the store unless the options were handed
through (settings outside a run, the warehouse resource's EnvVars inside one).

Real parts only: moto's server on 127.0.0.1, the process's Spark session, Dagster jobs executed
on a real instance, the sensor evaluated with `build_sensor_context`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator

import dagster as dg
import pytest

from backfill_assets.barrier.follower import stop_request, stop_uri
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.mv.controls import Controls, controls_uri, read_controls
from backfill_assets.storage import objects
from backfill_assets.wiring.sensors import build_barrier_sensor
from jobs.controls import build_controls_job
from jobs.follower import build_follower_jobs
from resources.mv import mv_tables
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource
from tests.reliability import harness as H
from tests.support import caught_up, simple_mv, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

VNODES = 8


@pytest.fixture
def s3_warehouse(s3_server, tmp_path, monkeypatch) -> Iterator[tuple[str, dict]]:
    """A fresh `s3://` warehouse as the settings see it: BACKFILL_STORAGE_OPTIONS names
    STORE_* variables (no AWS_* in the environment); the working directory is an empty folder,
    so a document written to a local path by mistake would show there."""
    warehouse, opts = s3_server.fresh_uri("controls"), dict(s3_server.storage_options)
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in opts.items():
        monkeypatch.setenv(f"STORE_{name}", value)
    monkeypatch.setenv("BACKFILL_STORAGE_OPTIONS", json.dumps({k: f"STORE_{k}" for k in opts}))
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield warehouse, opts
    assert [p.name for p in cwd.iterdir() if p.name.startswith("s3")] == [], \
        "a document went to a local folder instead of the store"


def _events(result, kind: str) -> list:
    return [e for e in result.all_events if e.event_type_value == kind]


def test_set_controls_job_pause_and_resume_reach_the_next_barrier_on_s3(spark, s3_warehouse):
    warehouse, opts = s3_warehouse
    settings = load_settings()
    live = H.orders(warehouse, seed=61, storage_options=opts)
    live.create(rows=160)
    d = simple_mv(VNODES, chunk_size=4)
    tables = mv_tables(d, settings)
    assert tables.storage_options == opts  # resolved from the STORE_* variables
    job, instance = build_controls_job(d, settings), dg.DagsterInstance.ephemeral()
    resources = {"warehouse": warehouse_resource(settings)}  # EnvVars, resolved in the run

    def set_controls(**config):
        return job.execute_in_process(run_config={"ops": {"set_controls": {"config": config}}},
                                      instance=instance, resources=resources,
                                      raise_on_error=False)

    vnodes = list(range(VNODES))
    first = run_barrier(spark, d, tables, vnodes)
    assert 0 < first.snapshot_rows <= 4 * VNODES and not first.finished

    paused_run = set_controls(snapshot="pause")
    assert paused_run.success and read_controls(tables) == Controls(rate_limit=0)
    assert objects.exists(controls_uri(tables), opts)  # an object in the store, beside the MV
    observed = _events(paused_run, "ASSET_OBSERVATION")[0].event_specific_data
    assert observed.asset_observation.metadata["paused"].value is True
    check = _events(paused_run, "ASSET_CHECK_EVALUATION")[0].event_specific_data
    assert check.metadata["state"].value == "paused"  # figures read from the S3 tables
    live.apply(live.random_batch(20))
    paused = run_barrier(spark, d, tables, vnodes)
    assert paused.paused and paused.snapshot_rows == 0
    assert paused.progress == first.progress  # positions and row counts did not move

    stored = objects.read_bytes(controls_uri(tables), opts)
    for bad in ({"snapshot": "pause", "rate_limit": 100}, {"chunk_size": 0}):
        failed = set_controls(**bad)
        assert not failed.success
        assert failed.failure_data_for_node("set_controls").error.cause.cls_name == \
            "InvalidControl"
    assert objects.read_bytes(controls_uri(tables), opts) == stored  # nothing written

    assert set_controls(snapshot="resume", rate_limit=1000, chunk_size=50).success
    assert read_controls(tables) == Controls(chunk_size=50, rate_limit=1000)
    resumed = run_barrier(spark, d, tables, vnodes)
    assert not resumed.paused and resumed.snapshot_rows > 0 and resumed.chunk_limit == 50
    while not resumed.finished:
        resumed = run_barrier(spark, d, tables, vnodes)
    assert H.assert_oracle(spark, d, tables, "controls on S3") > 0


class _InFlight:
    """A step hook that holds the first barrier after `arm()` just before its progress commit,
    until the test has requested the stop: the stop then arrives while a barrier is in flight."""

    def __init__(self) -> None:
        self.armed, self.reached, self.release = (threading.Event(), threading.Event(),
                                                  threading.Event())
        self.barriers = 0  # barriers begun (one step each in arrangement mode)

    def __call__(self, point: str) -> None:
        if point == "before_write":
            self.barriers += 1
        if point == "before_progress_commit" and self.armed.is_set() \
                and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(60), "the test never released the barrier"


@pytest.mark.slow
def test_follower_on_s3_stops_on_request_and_stays_stopped(spark, s3_warehouse, dagster_home):
    warehouse, opts = s3_warehouse
    settings = dataclasses.replace(load_settings(), continuous=True)
    live = H.orders(warehouse, seed=62, storage_options=opts)
    live.create(rows=120)
    d = simple_mv(VNODES, chunk_size=400)  # the first barrier finishes every vnode
    tables = mv_tables(d, settings)
    hook = _InFlight()
    follower, stop_job, start_job = build_follower_jobs(d, settings, hook)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    instance = dg.DagsterInstance.local_temp(dagster_home)
    config = {"ops": {"follow_upstream": {"config": {"poll_seconds": 0.2}}}}
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(run=follower.execute_in_process(
        instance=instance, resources=resources, raise_on_error=False, run_config=config)),
        daemon=True)
    thread.start()
    wait_for("the first barrier", lambda: caught_up(tables, 0, VNODES), 60)

    hook.armed.set()
    latest = live.apply(live.random_batch(10))
    assert hook.reached.wait(60), "the follower did not take the new version"
    assert stop_job.execute_in_process(instance=instance, resources=resources).success
    assert stop_request(tables)["reason"].startswith("stop_follower_job run")
    assert objects.exists(stop_uri(tables), opts)
    in_flight = hook.barriers
    hook.release.set()
    thread.join(60)
    assert not thread.is_alive(), "the follower did not stop on request"
    run = result["run"]
    assert run.success and run.output_for_node("follow_upstream") == in_flight
    assert caught_up(tables, latest, VNODES), "the barrier in flight did not commit"
    assert hook.barriers == in_flight, "the follower began a barrier after the stop request"

    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=1)
    live.apply(live.random_batch(10))  # new work: still no restart while stopped
    stopped = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(stopped, dg.SkipReason), stopped
    assert "stopped on request (stop_follower_job run" in stopped.skip_message
    assert "start_follower_job" in stopped.skip_message

    assert start_job.execute_in_process(instance=instance, resources=resources).success
    assert stop_request(tables) is None and not objects.exists(stop_uri(tables), opts)
    requests = sensor(dg.build_sensor_context(instance=instance))
    assert [r.run_key for r in requests] == [f"{d.name}:follower:0-{VNODES - 1}:after:"
                                             f"{run.run_id}"]
    restarted = follower.execute_in_process(  # what the sensor's request launches
        instance=instance, resources=resources, tags=requests[0].tags,
        run_config={"ops": {"follow_upstream": {"config": {"max_barriers": 1}}}})
    assert restarted.output_for_node("follow_upstream") == 1
    assert caught_up(tables, H.latest(live.uri, opts), VNODES)
    assert H.assert_oracle(spark, d, tables, "follower on S3") > 0
