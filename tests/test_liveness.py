"""Liveness without Spark: the sensor keeps followers alive by run status, run monitoring sees a
killed worker through the project's dagster.yaml, and skipped ticks say why."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import time
import uuid

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from backfill_assets.barrier.follower import clear_stop, request_stop
from backfill_assets.core.errors import InvalidSettings
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.liveness import FOLLOWER_JOB, VNODES_TAG
from backfill_assets.wiring.run_launcher import PidCheckingRunLauncher
from backfill_assets.wiring.sensors import build_barrier_sensor
from resources.mv import load_mv_definition, mv_tables
from resources.settings import load_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VNODES = 8


def _run(instance: dg.DagsterInstance, job: str, tags: dict,
         status=dg.DagsterRunStatus.STARTED) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), tags=tags, status=status)
    return instance.add_run(run)


def _project_instance(dagster_home: str) -> dg.DagsterInstance:
    shutil.copy(os.path.join(ROOT, "dagster.yaml"), dagster_home)
    return dg.DagsterInstance.from_config(dagster_home)


def test_sensor_keeps_one_follower_per_range_and_says_why_it_skips(warehouse, dagster_home,
                                                                   monkeypatch):
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    monkeypatch.setenv("BACKFILL_VNODE_COUNT", str(VNODES))
    settings = dataclasses.replace(load_settings(), continuous=True)
    d = load_mv_definition(settings)
    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=2)
    instance = _project_instance(dagster_home)
    run_load(f"{warehouse}/upstream", LoadParams(seed=1, initial_rows=50, versions=0),
             vnode_count=VNODES)

    first = sensor(dg.build_sensor_context(instance=instance))
    assert [r.tags[VNODES_TAG] for r in first] == ["0-3", "4-7"]
    assert all(r.run_key.endswith(":after:none") for r in first)
    live = _run(instance, FOLLOWER_JOB, first[0].tags)
    _run(instance, "backfill_job", {"dagster/asset_partition_range_start": "5",
                                    "dagster/asset_partition_range_end": "5"})
    skipped = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(skipped, dg.SkipReason)
    assert f"follower_job run {live.run_id[:8]} is STARTED" in skipped.skip_message
    assert "vnodes 4..7: backfill_job run" in skipped.skip_message

    instance.report_run_failed(live)  # what run monitoring does for a SIGKILLed worker
    again = sensor(dg.build_sensor_context(instance=instance))
    assert [r.run_key for r in again] == [f"{d.name}:follower:0-3:after:{live.run_id}"]

    request_stop(mv_tables(d, settings), "test")
    stopped = sensor(dg.build_sensor_context(instance=instance))
    assert "stopped on request (test)" in stopped.skip_message
    assert "start_follower_job" in stopped.skip_message
    clear_stop(mv_tables(d, settings))
    assert len(sensor(dg.build_sensor_context(instance=instance))) == 1


def test_run_monitoring_marks_a_killed_worker_failed(dagster_home):
    instance = _project_instance(dagster_home)
    assert isinstance(instance.run_launcher, PidCheckingRunLauncher)
    assert instance.run_monitoring_enabled
    worker = subprocess.Popen(["sleep", "120"])
    run = _run(instance, FOLLOWER_JOB, {VNODES_TAG: "0-7"})
    instance.report_engine_event("Executing steps in process", run,
                                 EngineEventData.in_process(worker.pid))
    record = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))[0]
    log = logging.getLogger("test")
    monitor_started_run(instance, None, record, log)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    worker.kill()
    worker.wait()
    time.sleep(0.1)
    monitor_started_run(instance, None, record, log)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


def test_continuous_setting_is_a_flag():
    assert load_settings({"BACKFILL_CONTINUOUS": "1"}).continuous
    assert not load_settings({}).continuous
    with pytest.raises(InvalidSettings, match="BACKFILL_CONTINUOUS"):
        load_settings({"BACKFILL_CONTINUOUS": "maybe"})
