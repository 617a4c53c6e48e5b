"""The core e2e scenario beyond one machine: every table on the S3-compatible server, Spark on
the standalone cluster (or a Spark Connect server), Dagster runs from the command line.

Settings only, as README "Scale out" says: BACKFILL_WAREHOUSE=s3://..., the storage options
through BACKFILL_STORAGE_OPTIONS (env var names, resolved by dagster.EnvVar), and
BACKFILL_SPARK_MASTER=spark://... or BACKFILL_SPARK_REMOTE=sc://.... A barrier, changes, a
second barrier that finishes every vnode, then verify_job's independent recomputation.
"""

from __future__ import annotations

import json

import pytest

from backfill_assets.storage import objects
from backfill_assets.upstream.writer import LoadParams, run_load
from resources.spark import child_env
from tests.infra.dagster_cli import execute, mv_yaml

VNODES = 8
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def _scenario(tmp_path, s3_server, spark_env: dict[str, str]) -> None:
    warehouse = s3_server.fresh_uri("warehouse")
    opts = s3_server.storage_options
    upstream = f"{warehouse}/upstream"
    run_load(upstream, LoadParams(seed=7, initial_rows=1500, versions=1, changes_per_version=40),
             vnode_count=VNODES, storage_options=opts)
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = child_env({
        **s3_server.env(), **spark_env,
        "BACKFILL_WAREHOUSE": warehouse, "BACKFILL_VNODE_COUNT": str(VNODES),
        "BACKFILL_MV_CONFIG": mv_yaml(tmp_path, chunk_size=150, vnode_count=VNODES),
        "DAGSTER_HOME": str(home),
        "BACKFILL_SPARK_CONF": json.dumps({"spark.executor.memory": "1g",
                                           "spark.driver.memory": "1g"}),
    })
    for var in ("BACKFILL_SPARK_MASTER", "BACKFILL_SPARK_REMOTE"):
        if var not in spark_env:
            env.pop(var, None)
    out = execute(env, "backfill_job")
    assert f"vnodes 0..{VNODES - 1}" in out
    run_load(upstream, LoadParams(seed=8, versions=2, changes_per_version=30),
             vnode_count=VNODES, storage_options=opts)
    out = execute(env, "backfill_job")
    assert f"{VNODES}/{VNODES} finished" in out, out[-3000:]
    out = execute(env, "verify_job")
    assert f"over {VNODES} vnodes: 0 vnodes differ" in out, out[-3000:]
    # nothing was written locally: every table is on the store
    names = {o.uri[len(warehouse) + 1:].split("/", 1)[0]
             for o in objects.list_prefix(warehouse, opts)}
    assert names == {"upstream", "orders_mv"}, names  # the MV's tables live under its name


def test_backfill_on_the_cluster_with_tables_on_s3(spark_cluster, s3_server, tmp_path):
    _scenario(tmp_path, s3_server, {"BACKFILL_SPARK_MASTER": spark_cluster.master_url})


def test_backfill_through_spark_connect_with_tables_on_s3(spark_connect, s3_server, tmp_path):
    _scenario(tmp_path, s3_server, {"BACKFILL_SPARK_REMOTE": spark_connect.remote_url})


def test_barrier_sensor_reads_an_upstream_on_s3(s3_server, tmp_path, monkeypatch):
    """The sensor runs outside any run (no resources): it resolves the storage options from
    settings itself (BACKFILL_STORAGE_OPTIONS names the env vars) and asks for a barrier."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    import dagster as dg

    from backfill_assets.wiring.sensors import build_barrier_sensor
    from resources.mv import load_mv_definition
    from resources.settings import load_settings

    warehouse = s3_server.fresh_uri("sensor")
    run_load(f"{warehouse}/upstream", LoadParams(seed=7, initial_rows=200, versions=1,
                                                 changes_per_version=10),
             vnode_count=VNODES, storage_options=s3_server.storage_options)
    # values in variables of other names than deltalake's (which it would read by itself)
    opts = s3_server.storage_options
    env = {**{f"STORE_{k}": v for k, v in opts.items()},
           "BACKFILL_STORAGE_OPTIONS": json.dumps({k: f"STORE_{k}" for k in opts}),
           "BACKFILL_WAREHOUSE": warehouse,
           "BACKFILL_VNODE_COUNT": str(VNODES),
           "BACKFILL_MV_CONFIG": mv_yaml(tmp_path, vnode_count=VNODES)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    sensor = build_barrier_sensor(load_mv_definition(settings), settings, "backfill_job", 2)
    with dg.DagsterInstance.ephemeral() as instance:
        requests = sensor(dg.build_sensor_context(instance=instance))
    assert [r.tags["dagster/asset_partition_range_start"] for r in requests] == ["0", "4"]
    from backfill_assets.storage import latest_version

    version = latest_version(f"{warehouse}/upstream", s3_server.storage_options)
    assert all(f":v{version}:" in r.run_key for r in requests)
