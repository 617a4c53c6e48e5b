"""Continuous mode under `dagster dev`: the follower is SIGKILLed at random points while the
upstream keeps changing; the barrier sensor restarts it every time (run monitoring / the code
server mark the dead run FAILURE); the documented CLI command stops it; the MV matches the
oracle with nothing lost or duplicated.

Nothing here runs in-process: the daemon's sensor launches every follower run through the
project's instance config, exactly as `make ui` does with BACKFILL_CONTINUOUS=1.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import dagster as dg
import pytest
import yaml

from backfill_assets.mv.owned_tables import open_if_exists, read_rows
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.liveness import FOLLOWER_JOB
from backfill_assets.wiring.run_launcher import worker_pid
from benchmarks import dagster_dev
from jobs.ports import free_port
from resources.mv import load_mv_definition, mv_tables
from resources.settings import load_settings
from tests.support import assert_verified

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VNODES = 8
KILLS = 2


def _env(tmp_path, warehouse: str, home: str) -> dict:
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw.update(chunk_size=60, vnode_count=VNODES, mode="arrangement")  # chunked barriers to kill in
    mv_yaml = tmp_path / "mv.yaml"
    mv_yaml.write_text(yaml.safe_dump(raw))
    return {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": home,
            "BACKFILL_VNODE_COUNT": str(VNODES), "BACKFILL_MV_CONFIG": str(mv_yaml),
            "BACKFILL_CONTINUOUS": "1", "BACKFILL_SPARK_MASTER": "local[1]",
            "PYTHONUNBUFFERED": "1"}


class _Writer(threading.Thread):
    """One DML version of the upstream every 0.7 s until stopped."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.uri, self.halt, self.n = uri, threading.Event(), 0

    def run(self) -> None:
        while not self.halt.is_set():
            run_load(self.uri, LoadParams(seed=500 + self.n, versions=1, changes_per_version=15))
            self.n += 1
            self.halt.wait(0.7)


def _followers(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return [r.dagster_run for r in instance.get_run_records(
        dg.RunsFilter(job_name=FOLLOWER_JOB))]


def _wait(what: str, predicate, proc, log: str, seconds: float = 240):
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        assert proc.poll() is None, f"dagster dev exited; see {log}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}; see {log}"
        time.sleep(0.5)


def _barriers_done(instance: dg.DagsterInstance, run_id: str) -> int:
    run = instance.get_run_by_id(run_id)
    return int(run.tags.get("follower/barriers", 0)) if run else 0


def _caught_up(tables, upstream_uri: str) -> bool:
    progress = open_if_exists(tables.progress, {})
    if progress is None:
        return False
    latest = open_if_exists(upstream_uri, {}).version()
    rows = read_rows(progress, None, ["backfill_finished", "version"]).to_pylist()
    return len(rows) == VNODES and all(r["backfill_finished"] and r["version"] == latest
                                       for r in rows)


@pytest.mark.slow
@pytest.mark.spark
def test_killed_follower_is_restarted_and_converges(spark, tmp_path, figures, monkeypatch):
    warehouse, home = str(tmp_path / "warehouse"), str(tmp_path / "dagster_home")
    env = _env(tmp_path, warehouse, home)
    upstream = f"{warehouse}/upstream"
    run_load(upstream, LoadParams(seed=11, initial_rows=1500, versions=0), vnode_count=VNODES)
    log = str(tmp_path / "dagster_dev.log")
    proc = dagster_dev.start(env, log, port=free_port())
    writer = _Writer(upstream)
    rng = random.Random(15)
    killed: list[str] = []
    try:
        monkeypatch.setenv("DAGSTER_HOME", home)  # this process reads the same instance
        instance = dg.DagsterInstance.get()
        writer.start()
        for _ in range(KILLS):
            run = _wait("a live follower", lambda: next(
                (r for r in _followers(instance) if r.status == dg.DagsterRunStatus.STARTED
                 and r.run_id not in killed and _barriers_done(instance, r.run_id) >= 1),
                None), proc, log)
            time.sleep(rng.uniform(0.0, 4.0))  # a random point of the barrier loop
            pid, _ = worker_pid(instance, run.run_id)
            os.kill(pid, signal.SIGKILL)
            killed.append(run.run_id)
            _wait("the killed run to be marked failed", lambda r=run.run_id: instance.get_run_by_id(
                r).status == dg.DagsterRunStatus.FAILURE, proc, log, seconds=60)
        writer.halt.set()
        writer.join()
        settings = load_settings(env)
        tables = mv_tables(load_mv_definition(settings), settings)
        # the sensor restarts the last killed follower; only then is the stop request sent
        # (a follower killed after it had caught up leaves the MV caught up with none alive)
        _wait("the restarted follower", lambda: next(
            (r for r in _followers(instance) if r.status == dg.DagsterRunStatus.STARTED
             and r.run_id not in killed), None), proc, log)
        _wait("the restarted follower to catch up", lambda: _caught_up(tables, upstream),
              proc, log, seconds=300)
        stop = subprocess.run(
            [sys.executable, "-m", "dagster", "job", "execute", "-m", "backfill_assets.definitions",
             "-j", "stop_follower_job"], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=180)
        assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
        last = _wait("the follower to stop on request", lambda: next(
            (r for r in _followers(instance) if r.status == dg.DagsterRunStatus.SUCCESS), None),
            proc, log, seconds=60)
    finally:
        writer.halt.set()
        dagster_dev.stop(proc)
    runs = _followers(instance)
    assert [r.run_id for r in runs if r.status == dg.DagsterRunStatus.FAILURE] == killed[::-1]
    assert last.run_id == runs[0].run_id and len(runs) == KILLS + 1
    d = load_mv_definition(settings)
    stats = {"verified_rows": 0}
    assert_verified(spark, d, tables, stats)  # nothing lost, nothing duplicated
    figures["follower_kills"] += KILLS
    figures["rows_compared"] += stats["verified_rows"]


@pytest.mark.slow
@pytest.mark.spark
def test_interrupt_stops_the_follower_after_its_barrier(spark, tmp_path, monkeypatch):
    """What Dagster's Terminate does to a run worker (DefaultRunLauncher.terminate: record
    CANCELING, then interrupt the process), here on `dagster job execute -j follower_job`: the
    barrier in flight commits, the run ends CANCELED, and a stop request keeps the sensor from
    restarting it. (A bare Ctrl-C does the same, but Dagster records FAILURE.)"""
    warehouse, home = str(tmp_path / "warehouse"), str(tmp_path / "dagster_home")
    env = _env(tmp_path, warehouse, home)
    dagster_dev.install_instance(home)
    upstream = f"{warehouse}/upstream"
    run_load(upstream, LoadParams(seed=12, initial_rows=800, versions=0), vnode_count=VNODES)
    log = tmp_path / "follower.log"
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "job", "execute", "-m",
             "backfill_assets.definitions", "-j", FOLLOWER_JOB], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT)
    monkeypatch.setenv("DAGSTER_HOME", home)
    instance = dg.DagsterInstance.get()
    writer = _Writer(upstream)
    writer.start()
    try:
        run = _wait("two barriers", lambda: next(
            (r for r in _followers(instance) if _barriers_done(instance, r.run_id) >= 2), None),
            proc, str(log), seconds=180)
        instance.report_run_canceling(run)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) is not None
    finally:
        writer.halt.set()
        writer.join()
        if proc.poll() is None:
            proc.kill()
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED
    assert "follower stopped (interrupt) after" in log.read_text()
    settings = load_settings(env)
    d = load_mv_definition(settings)
    tables = mv_tables(d, settings)
    from backfill_assets.barrier.follower import stop_request

    assert "terminated" in stop_request(tables)["reason"]
    assert_verified(spark, d, tables)
