"""A Postgres-backed Dagster instance (deploy/dagster.postgres.yaml) against a real server.

The documented file is used as it is: DAGSTER_HOME holds a copy, the DAGSTER_PG_* variables
point it at the loopback PostgreSQL server the fixture started. ``dagster job execute`` runs a
barrier over a tiny upstream made by the project's load generator and the barrier sensor is
evaluated with that instance. Then ``dagster-daemon run`` does what it does in production: its
sensor loop turns the next upstream version into one run per vnode range (3 ranges), the
queued run coordinator queues them, and the daemon dequeues at most 2 at a time for the MV (the
per-MV tag limit of the file): the third run is seen QUEUED while two are in flight, and all
three succeed. Finally ``dagster job launch`` shows a command-line launch is queued too.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import dagster as dg
import pytest
from deltalake import DeltaTable

from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.liveness import MV_TAG
from backfill_assets.wiring.sensors import build_barrier_sensor
from resources.mv import load_mv_definition
from resources.settings import load_settings
from resources.spark import child_env
from tests.infra import procs
from tests.infra.dagster_cli import ROOT, dagster, execute, mv_yaml

DEPLOY_YAML = os.path.join(ROOT, "deploy", "dagster.postgres.yaml")
VNODES = 8
SENSOR = "upstream_barrier_sensor"
IN_FLIGHT = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_backfill_job_and_sensor_on_a_postgres_instance(postgres_server, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY_YAML, home / "dagster.yaml")
    warehouse = str(tmp_path / "warehouse")
    settings_env = {"DAGSTER_HOME": str(home), "BACKFILL_WAREHOUSE": warehouse,
                    "BACKFILL_VNODE_COUNT": str(VNODES),
                    "BACKFILL_MV_CONFIG": mv_yaml(tmp_path, chunk_size=1000, vnode_count=VNODES),
                    **postgres_server.env()}
    env = child_env(settings_env)
    run_load(f"{warehouse}/upstream", LoadParams(seed=7, initial_rows=2000, versions=1,
                                                 changes_per_version=30), vnode_count=VNODES)

    out = execute(env, "backfill_job")
    assert f"{VNODES}/{VNODES} finished" in out, out[-3000:]

    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert type(instance.run_coordinator).__name__ == "MVTaggingRunCoordinator"
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert {"key": MV_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 2} in limits
        assert instance.run_monitoring_enabled
        assert type(instance.run_launcher).__name__ == "PidCheckingRunLauncher"

        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS and run.tags[MV_TAG] == "orders_mv"
        done = instance.fetch_materializations(dg.AssetKey("downstream_mv"), limit=100).records
        vnodes = {r.partition_key for r in done if r.partition_key is not None}
        assert vnodes == {str(v) for v in range(VNODES)}

        # the barrier sensor, its cursor and in-flight check against the Postgres instance
        run_load(f"{warehouse}/upstream", LoadParams(seed=8, versions=1, changes_per_version=20),
                 vnode_count=VNODES)
        settings = load_settings()
        sensor = build_barrier_sensor(load_mv_definition(settings), settings, "backfill_job",
                                      ranges=2)
        ctx = dg.build_sensor_context(instance=instance)
        requests = sensor(ctx)
        assert [r.tags["dagster/asset_partition_range_start"] for r in requests] == ["0", "4"]
        version = DeltaTable(f"{warehouse}/upstream").version()
        assert all(f":v{version}:" in r.run_key for r in requests)

    _daemon_runs_the_sensor_barrier(env, home, tmp_path, version)

    # a launched run goes through the queued run coordinator (no daemon here: it stays queued)
    dagster(env, "job", "launch", "-m", "backfill_assets.definitions", "-j", "backfill_job")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        queued = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
        assert len(queued) == 1 and queued[0].tags[MV_TAG] == "orders_mv"


def _daemon_runs_the_sensor_barrier(env: dict, home, tmp_path, version: int) -> None:
    """The daemon ticks the sensor (3 vnode ranges), queues 3 runs, runs at most 2 at once."""
    daemon_env = {**env, "BACKFILL_RUN_RANGES": "3", "BACKFILL_SPARK_MASTER": "local[1]"}
    exe = os.path.join(os.path.dirname(sys.executable), "dagster-daemon")
    daemon = procs.start("dagster-daemon", [exe, "run", "-w", "workspace.yaml"],
                         str(tmp_path / "daemon.log"), env=daemon_env, cwd=ROOT)
    held = in_flight_max = 0
    with procs.running(daemon), dg.DagsterInstance.from_config(str(home)) as instance:
        deadline = time.monotonic() + 420
        while True:
            runs = instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": SENSOR}))
            flying = sum(r.status in IN_FLIGHT for r in runs)
            queued = sum(r.status == dg.DagsterRunStatus.QUEUED for r in runs)
            in_flight_max = max(in_flight_max, flying)
            held += flying == 2 and queued >= 1  # the limit holding a run back
            if len(runs) == 3 and all(r.is_finished for r in runs):
                break
            assert time.monotonic() < deadline, \
                f"runs {[r.status for r in runs]}; daemon log:\n{daemon.log_tail()}"
            assert daemon.proc.poll() is None, daemon.log_tail()
            time.sleep(1)
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), \
            [(r.run_id, r.status) for r in runs]
        assert sorted(r.tags["dagster/asset_partition_range_start"] for r in runs) == \
            ["0", "3", "5"]
        assert all(f":v{version}:" in r.tags["dagster/run_key"] for r in runs)
        assert in_flight_max <= 2 and held, (in_flight_max, held)
        records = instance.get_run_records(dg.RunsFilter(run_ids=[r.run_id for r in runs]))
        spans = [(r.start_time, r.end_time) for r in records]
        overlap = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
        assert overlap <= 2, spans  # by the run records' own start/end times too
        for run in runs:
            kinds = {e.dagster_event.event_type_value for e in instance.all_logs(run.run_id)
                     if e.dagster_event is not None}
            # queued by the coordinator, then started by the daemon's run queue
            assert {"PIPELINE_ENQUEUED", "PIPELINE_STARTING"} <= kinds, (run.run_id, kinds)
        done = instance.fetch_materializations(dg.AssetKey("downstream_mv"), limit=100).records
        fresh = {r.partition_key for r in done if r.run_id in {x.run_id for x in runs}
                 and r.partition_key is not None}  # None: each barrier's summary
        assert fresh == {str(v) for v in range(VNODES)}
