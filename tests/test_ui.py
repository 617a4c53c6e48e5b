"""What a user sees in `dagster dev`, asked through Dagster's GraphQL API (as the UI does).

A small platform (8 vnodes) is brought to a mixed state through the UI's own route (asset
materializations of a vnode range with the asset check added, as both launch dialogs do), then
verified and paused; `dagster dev` serves it and the test compares the partition statuses with
the progress table, and looks for the check result and the figures. `quiet`: the server's
barrier sensor must not start barriers under the test (see jobs/dagster_dev.py).
"""

from __future__ import annotations

import os

import dagster as dg
import pytest
import yaml

from backfill_assets import mv_store
from backfill_assets.assets import build_assets
from backfill_assets.checks import (
    CHECK_NAME,
    PROGRESS_CHECK,
    build_oracle_check,
    build_progress_check,
)
from backfill_assets.core import codec
from backfill_assets.load_generator import LoadParams, run_load
from backfill_assets.partitions import range_tags, vnode_key
from jobs.controls import build_controls_job
from jobs.dagster_dev import ROOT, dagster_dev, graphql
from jobs.verify import build_verify_job
from resources.mv import load_mv_definition, mv_tables
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

VNODES = 8
ASSETS = """
query Assets($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    isMaterializable
    assetPartitionStatuses { ... on DefaultPartitionStatuses {
      materializedPartitions unmaterializedPartitions failedPartitions } }
    assetObservations(limit: 20) { partition metadataEntries { label
      ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue }
      ... on TextMetadataEntry { text } ... on BoolMetadataEntry { boolValue } } }
  }
}"""
CHECKS = """
query Checks($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 10) {
    runId status evaluation { success metadataEntries { label } } }
}"""


def _mv_yaml(tmp_path, chunk_size: int) -> str:
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    # chunked (arrangement) mode: a barrier reads one chunk per vnode, so the UI can show
    # vnodes in progress (snapshot mode, the default, finishes a vnode in one barrier)
    raw.update(chunk_size=chunk_size, vnode_count=VNODES, mode="arrangement")
    path = tmp_path / "mv.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _small_platform(tmp_path, warehouse: str, dagster_home: str) -> dict:
    """vnodes 0..3 finished, 4..5 in progress, 6..7 not started; verified; then paused."""
    env = {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
           "BACKFILL_VNODE_COUNT": str(VNODES),
           "BACKFILL_MV_CONFIG": _mv_yaml(tmp_path, chunk_size=50)}
    settings = load_settings(env)
    d = load_mv_definition(settings)
    run_load(settings.table_uri("upstream"), LoadParams(seed=5, initial_rows=600, versions=1,
                                                        changes_per_version=20),
             vnode_count=VNODES)
    instance = dg.DagsterInstance.from_config(dagster_home)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    checks = [build_oracle_check(d, settings), build_progress_check(d, settings)]
    ui_selection = (dg.AssetSelection.assets("replicated_state", "downstream_mv",
                                             "backfill_progress")
                    | dg.AssetSelection.checks_for_assets("downstream_mv"))
    for first, last in ((0, 3), (0, 3), (4, 5)):
        result = dg.materialize([*build_assets(d, settings), *checks], instance=instance,
                                selection=ui_selection, resources=resources,
                                tags=range_tags(first, last, VNODES))
        assert result.success
        names = [e.check_name for e in result.get_asset_check_evaluations()]
        assert names == [PROGRESS_CHECK]  # the oracle is skipped: not recomputed per barrier
        said = [e.user_message for e in instance.all_logs(result.run_id)]
        assert any("downstream_mv committed" in m for m in said)  # phases, while it runs
    verify = build_verify_job(d, settings).execute_in_process(instance=instance,
                                                              resources=resources)
    assert verify.success
    controls = build_controls_job(d, settings).execute_in_process(
        instance=instance, run_config={"ops": {"set_controls": {"config": {
            "snapshot": "pause"}}}})
    assert controls.success
    tables = mv_tables(d, settings)
    rows = mv_store.read_rows(mv_store.open_table(tables.progress, tables.storage_options), None,
                              [codec.VNODE, codec.FINISHED]).to_pylist()
    env["finished"] = {vnode_key(r[codec.VNODE], VNODES) for r in rows if r[codec.FINISHED]}
    env["started"] = {vnode_key(r[codec.VNODE], VNODES) for r in rows}
    return env


@pytest.mark.slow
@pytest.mark.spark
def test_dagster_dev_shows_the_tables_truthfully(spark, tmp_path, warehouse, dagster_home):
    env = _small_platform(tmp_path, warehouse, dagster_home)
    finished, started = env.pop("finished"), env.pop("started")
    assert finished == {"0", "1", "2", "3"} and started == finished | {"4", "5"}
    with dagster_dev(env, str(tmp_path / "dagster_dev.log"), quiet=True) as url:
        keys = [{"path": [k]} for k in ("upstream_table", "replicated_state", "downstream_mv",
                                        "backfill_progress")]
        nodes = {n["assetKey"]["path"][0]: n
                 for n in graphql(url, ASSETS, {"keys": keys})["assetNodes"]}
        checks = graphql(url, CHECKS, {"key": {"path": ["downstream_mv"]},
                                       "name": CHECK_NAME})["assetCheckExecutions"]
        progress_checks = graphql(url, CHECKS, {"key": {"path": ["downstream_mv"]},
                                                "name": PROGRESS_CHECK})["assetCheckExecutions"]
    mv, progress = nodes["downstream_mv"], nodes["backfill_progress"]
    assert set(mv["assetPartitionStatuses"]["materializedPartitions"]) == finished
    assert set(mv["assetPartitionStatuses"]["unmaterializedPartitions"]) == \
        {vnode_key(v, VNODES) for v in range(VNODES)} - finished
    assert set(progress["assetPartitionStatuses"]["materializedPartitions"]) == started
    assert not mv["assetPartitionStatuses"]["failedPartitions"]
    assert not nodes["upstream_table"]["isMaterializable"]  # not offered: nothing to run

    in_progress = {o["partition"] for o in mv["assetObservations"] if o["partition"]}
    assert started - finished <= in_progress  # unfinished vnodes: observations, not "done"
    latest = {e["label"]: e for e in mv["assetObservations"][0]["metadataEntries"]}
    assert latest["paused"]["boolValue"] is True  # the controls in force, before any barrier
    barrier = next({e["label"]: e for e in o["metadataEntries"]}
                   for o in mv["assetObservations"]
                   if o["partition"] is None and any(e["label"] == "percent_done"
                                                     for e in o["metadataEntries"]))
    assert 0 < barrier["percent_done"]["floatValue"] < 100
    assert barrier["vnodes_finished"]["intValue"] == 4
    assert barrier["vnode_states"]["text"] == \
        "finished 0..3; in progress 4..5; not started 6..7"
    assert {"lag_versions", "lag_seconds", "rows_per_second", "eta"} <= set(barrier)
    assert barrier["upstream_version"]["intValue"] == 2

    evaluated = [c for c in checks if c["evaluation"]]
    assert len(evaluated) == 1 and evaluated[0]["status"] == "SUCCEEDED"
    assert evaluated[0]["evaluation"]["success"] is True
    assert "rows_compared" in {e["label"] for e in evaluated[0]["evaluation"]["metadataEntries"]}
    assert all(c["status"] == "SKIPPED" for c in checks if not c["evaluation"])
    assert len(progress_checks) == 3 and progress_checks[0]["status"] == "FAILED"  # a warning
    latest = {e["label"] for e in progress_checks[0]["evaluation"]["metadataEntries"]}
    assert {"percent_done", "rows_per_second", "lag_versions", "vnodes_finished"} <= latest
