"""A Postgres-backed Dagster instance (deploy/dagster.postgres.yaml) against a real server.

The documented file is used as it is: DAGSTER_HOME holds a copy, the DAGSTER_PG_* variables
point it at the loopback PostgreSQL server the fixture started. ``dagster job execute`` runs a
barrier over a tiny upstream made by the project's load generator, the barrier sensor is
evaluated with that instance, and ``dagster job launch`` shows runs are queued (the queued run
coordinator) with the per-MV concurrency tag the limits key on.
"""

from __future__ import annotations

import os
import shutil

import dagster as dg
import pytest
from deltalake import DeltaTable

from backfill_assets.load_generator import LoadParams, run_load
from backfill_assets.sensors import build_barrier_sensor
from jobs.backfill import MV_TAG
from resources.mv import load_mv_definition
from resources.settings import load_settings
from resources.spark import child_env
from tests.infra.dagster_cli import ROOT, dagster, execute, mv_yaml

DEPLOY_YAML = os.path.join(ROOT, "deploy", "dagster.postgres.yaml")
VNODES = 8
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
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
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

    # a launched run goes through the queued run coordinator (no daemon here: it stays queued)
    dagster(env, "job", "launch", "-m", "backfill_assets.definitions", "-j", "backfill_job")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        queued = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
        assert len(queued) == 1 and queued[0].tags[MV_TAG] == "orders_mv"
