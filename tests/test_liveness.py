"""Liveness without Spark: the sensor keeps followers alive by run status, run monitoring sees a
killed worker through the project's deploy/dagster.yaml, and skipped ticks say why."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType, EngineEventData
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from backfill_assets.barrier.follower import clear_stop, request_stop
from backfill_assets.core.errors import InvalidSettings
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.liveness import ABANDONED_TAG, FOLLOWER_JOB, VNODES_TAG, wait_turn
from backfill_assets.wiring.partitions import RANGE_END, RANGE_START
from backfill_assets.wiring.run_launcher import PidCheckingRunLauncher
from backfill_assets.wiring.sensors import build_barrier_sensor
from resources.mv import load_mv_definition, mv_tables
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VNODES = 8


def _run(instance: dg.DagsterInstance, job: str, tags: dict,
         status=dg.DagsterRunStatus.STARTED) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), tags=tags, status=status)
    return instance.add_run(run)


def _project_instance(dagster_home: str) -> dg.DagsterInstance:
    shutil.copy(os.path.join(ROOT, "deploy", "dagster.yaml"), dagster_home)
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


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dagster", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_failed_launch_is_refused_by_name_and_never_wedges_the_sensor(warehouse, dagster_home,
                                                                         monkeypatch):
    """What a new user did: the docs' range command with keys of another vnode count, then the
    sensor. The launch is refused by name (first line), and the run it left NOT_STARTED is
    waited on only while it could still start, then marked failed and passed over."""
    env = {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
           "BACKFILL_VNODE_COUNT": str(VNODES)}
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    monkeypatch.setenv("BACKFILL_VNODE_COUNT", str(VNODES))
    instance = _project_instance(dagster_home)
    run_load(f"{warehouse}/upstream", LoadParams(seed=1, initial_rows=50, versions=0),
             vnode_count=VNODES)
    proc = _cli(env, "job", "execute", "-m", "backfill_assets.definitions", "-j", "backfill_job",
                "--tags", json.dumps({RANGE_START: "000", RANGE_END: "127"}))
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert said and said[0].startswith("error: UnknownVnodePartition: no vnode partition "
                                       "'000', '127': this MV has 8 vnodes, keys '0'..'7'")
    assert "Traceback" not in proc.stderr and "DagsterInvalidInvocationError" not in proc.stderr
    proc = _cli(env, "asset", "materialize", "-m", "backfill_assets.definitions",
                "--select", "downstream_mv", "--partition-range", "00...07")
    assert "error: UnknownVnodePartition: no vnode partition '00'" in proc.stderr
    [left] = instance.get_runs()
    assert left.status == dg.DagsterRunStatus.NOT_STARTED  # Dagster created it, then failed

    settings = load_settings()
    d = load_mv_definition(settings)
    patient = build_barrier_sensor(d, settings, "backfill_job", ranges=1)
    waiting = patient(dg.build_sensor_context(instance=instance))
    assert isinstance(waiting, dg.SkipReason)
    assert f"backfill_job run {left.run_id[:8]} is NOT_STARTED" in waiting.skip_message
    time.sleep(1.5)
    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=1, never_started_after=1.0)
    [barrier] = sensor(dg.build_sensor_context(instance=instance))
    assert barrier.tags[RANGE_START] == "0" and barrier.tags[RANGE_END] == "7"
    marked = instance.get_run_by_id(left.run_id)
    assert marked.status == dg.DagsterRunStatus.FAILURE
    assert marked.tags[ABANDONED_TAG].startswith("never started (")
    failure = instance.all_logs(left.run_id, of_type=DagsterEventType.RUN_FAILURE)
    assert "marked failed by the barrier sensor: never started" in failure[-1].message


def _graph(warehouse: str):
    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse,
                              "BACKFILL_VNODE_COUNT": str(VNODES)})
    d = load_mv_definition(settings)
    defs = dg.Definitions(assets=build_assets(d, settings),
                          resources={"spark": spark_resource(settings),
                                     "warehouse": warehouse_resource(settings)})
    return d, settings, defs.get_repository_def().asset_graph


def test_the_sensor_leaves_a_ui_backfill_its_vnodes(warehouse, dagster_home, monkeypatch):
    """A partition backfill of vnodes 2..3 requested (what "Materialize…" of a set does) before
    its run exists: the sensor's range over them waits, the other range runs."""
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    monkeypatch.setenv("BACKFILL_VNODE_COUNT", str(VNODES))
    instance = _project_instance(dagster_home)
    run_load(f"{warehouse}/upstream", LoadParams(seed=1, initial_rows=50, versions=0),
             vnode_count=VNODES)
    d, settings, graph = _graph(warehouse)
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="uibackfill", asset_graph=graph, partition_names=["2", "3"],
        asset_selection=[dg.AssetKey("downstream_mv")], backfill_timestamp=time.time(),
        tags={}, dynamic_partitions_store=instance, all_partitions=False, title=None,
        description=None, run_config=None)
    instance.add_backfill(backfill)
    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=2)
    [run] = sensor(dg.build_sensor_context(instance=instance))
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("4", "7")
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    again = sensor(dg.build_sensor_context(instance=instance))
    assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in again] == [("0", "3"), ("4", "7")]


def test_overlapping_runs_take_turns_oldest_first(dagster_home):
    """One queue: a run waits while an earlier run over some of its vnodes is in flight, and
    the earlier one never waits for it (no deadlock); a follower is never waited for."""
    instance = _project_instance(dagster_home)
    first = _run(instance, "__ASSET_JOB", {RANGE_START: "2", RANGE_END: "3"})
    time.sleep(0.01)
    second = _run(instance, "backfill_job", {})
    _run(instance, FOLLOWER_JOB, {VNODES_TAG: "0-7"})
    said: list[str] = []
    wait_turn(instance, first.run_id, range(VNODES), VNODES, said.append)  # returns at once
    assert said == []
    ender = threading.Timer(1.0, instance.report_run_failed, [first])
    ender.start()
    started = time.monotonic()
    wait_turn(instance, second.run_id, range(VNODES), VNODES, said.append)
    assert time.monotonic() - started >= 1.0
    assert said == [f"waiting for __ASSET_JOB run {first.run_id[:8]} (STARTED), launched "
                    "earlier over some of the same vnodes; this run starts when it ends"]


def test_a_killed_run_ahead_is_not_waited_for(dagster_home):
    """A SIGKILLed `dagster job execute` run stays STARTED where no daemon monitors runs: the
    rerun that recovers it must not wait for it (its worker pid is gone)."""
    instance = _project_instance(dagster_home)
    worker = subprocess.Popen(["sleep", "120"])
    dead = _run(instance, "backfill_job", {})
    instance.report_engine_event("Executing steps in process", dead,
                                 EngineEventData.in_process(worker.pid))
    worker.kill()
    worker.wait()
    time.sleep(0.01)
    rerun = _run(instance, "backfill_job", {})
    said: list[str] = []
    started = time.monotonic()
    wait_turn(instance, rerun.run_id, range(VNODES), VNODES, said.append)
    assert said == [] and time.monotonic() - started < 1.0


def test_the_traceback_is_there_on_request(warehouse, dagster_home):
    """BACKFILL_TRACEBACK=1 (a setting): the named error first, Dagster's traceback after it."""
    env = {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
           "BACKFILL_VNODE_COUNT": str(VNODES), "BACKFILL_TRACEBACK": "1"}
    proc = _cli(env, "job", "execute", "-m", "backfill_assets.definitions", "-j", "backfill_job",
                "--tags", json.dumps({RANGE_START: "0", RANGE_END: "9"}))
    lines = [x for x in proc.stderr.splitlines() if x.startswith(("error:", "Traceback"))]
    assert lines[0].startswith("error: UnknownVnodePartition: no vnode partition '9'")
    assert lines[1].startswith("Traceback")
