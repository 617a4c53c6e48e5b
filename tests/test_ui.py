"""What a user sees in `dagster dev`, asked through Dagster's GraphQL API (as the UI does).

A small platform (8 vnodes) is brought to a mixed state through the UI's own route (an asset
materialization of a vnode range with the asset checks added, as both launch dialogs do, and
one barrier of the sensor's backfill_job), then verified and paused. Every run goes through
`jobs.workspace_runs` as the demo's do (runs of the
workspace's code location). `dagster dev` serves it and the test compares the partition
statuses with the progress table, looks for the check results as the asset page shows them
(not "Not evaluated"), the figures, and the runs as the Timeline queries them. `quiet`: the
server's barrier sensor must not start barriers under the test (see jobs/dagster_dev.py).
The state is left in the test's tmp folder with a `platform.env`, so the mid-backfill
screenshots are taken from it (README: docs/screenshots/mid_backfill).
"""

from __future__ import annotations

import os
import shlex
import sys
import time

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.reconstruct import ReconstructableJob

from backfill_assets.core import codec
from backfill_assets.mv import owned_tables
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.assets import MV, PROGRESS, REPLICA
from backfill_assets.wiring.checks import CHECK_NAME, PROGRESS_CHECK
from backfill_assets.wiring.partitions import range_tags, vnode_key
from jobs.dagster_dev import ROOT, dagster_dev, graphql
from jobs.ports import free_port
from jobs.workspace_runs import ASSET_JOB, MODULE, run_in_workspace
from resources.mv import load_mv_definition, mv_tables
from resources.settings import load_settings

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
    assetMaterializations(limit: 1) { partition metadataEntries { label
      ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue }
      ... on TextMetadataEntry { text } ... on BoolMetadataEntry { boolValue } } }
  }
}"""
CHECKS = """
query Checks($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 10) {
    runId status evaluation { success metadataEntries { label } } }
}"""
# what the asset page's check list reads ("Not evaluated" when this is null)
CHECK_STATUS = """
query CheckStatus($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) {
  assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization {
    status evaluation { severity description } } } } } } }"""
# what Overview > Timeline asks (useRunsForTimeline.tsx): a run without repositoryOrigin is
# dropped, the others are grouped by (location, repository, job) of the workspace
TIMELINE = """
query Timeline($filter: RunsFilter!) { runsOrError(filter: $filter, limit: 500) {
  ... on Runs { results { id pipelineName status startTime endTime
    repositoryOrigin { repositoryName repositoryLocationName } } } } }"""
WORKSPACE_JOBS = """{ workspaceOrError { ... on Workspace { locationEntries { name
  locationOrLoadError { ... on RepositoryLocation { repositories { name
    pipelines { name } } } } } } } }"""


def _mv_yaml(tmp_path, chunk_size: int) -> str:
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    # chunked (arrangement) mode: a barrier reads one chunk per vnode, so the UI can show
    # vnodes in progress (snapshot mode, the default, finishes a vnode in one barrier)
    raw.update(chunk_size=chunk_size, vnode_count=VNODES, mode="arrangement")
    path = tmp_path / "mv.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.fixture
def platform(tmp_path, warehouse, dagster_home, monkeypatch):
    """The settings of the small platform, in this process's environment, with the workspace's
    definitions module loaded for them (and forgotten afterwards)."""
    env = {"BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
           "BACKFILL_VNODE_COUNT": str(VNODES),
           "BACKFILL_MV_CONFIG": _mv_yaml(tmp_path, chunk_size=50)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "platform.env").write_text(  # for docs/screenshots/take.py --env
        "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items() if k != "DAGSTER_HOME"))
    _forget_definitions()
    yield {**os.environ, **env}
    _forget_definitions()


def _forget_definitions() -> None:
    """The definitions module reads the settings when imported; runs reconstruct the job
    from it (and Dagster keeps the last job loaded), so drop both."""
    sys.modules.pop(MODULE, None)
    ReconstructableJob.get_definition.cache_clear()
    ReconstructableJob.get_repository_definition.cache_clear()


def loaded(env: dict):
    """The platform's settings, MV definition and Dagster instance, its upstream created
    (600 rows, then one version of 20 changes)."""
    settings = load_settings(env)
    run_load(settings.table_uri("upstream"), LoadParams(seed=5, initial_rows=600, versions=1,
                                                        changes_per_version=20),
             vnode_count=VNODES)
    return (settings, load_mv_definition(settings),
            dg.DagsterInstance.from_config(env["DAGSTER_HOME"]))


def _small_platform(env: dict) -> dict:
    """vnodes 0..3 finished, 4..5 in progress, 6..7 not started; verified; then paused."""
    settings, d, instance = loaded(env)
    # "Materialize" on the asset pages: barriers until vnodes 0..3 are finished; then one
    # barrier of backfill_job (the sensor's) over 4..5, which leaves them in progress
    for job, first, last in ((ASSET_JOB, 0, 3), ("backfill_job", 4, 5)):
        selection = {REPLICA, MV, PROGRESS} if job == ASSET_JOB else None
        result = run_in_workspace(instance, job, asset_selection=selection,
                                  tags=range_tags(first, last, VNODES))
        assert result.success
        names = {e.check_name for e in result.get_asset_check_evaluations()}
        assert names == {PROGRESS_CHECK}  # the oracle is skipped: not recomputed per barrier
        said = [e.user_message for e in instance.all_logs(result.run_id)]
        assert any("downstream_mv committed" in m for m in said)  # phases, while it runs
        assert any("backfill_progress committed" in m and "% done" in m for m in said)
    assert run_in_workspace(instance, "verify_job").success
    assert run_in_workspace(instance, "set_controls_job", run_config={"ops": {"set_controls": {
        "config": {"snapshot": "pause"}}}}).success
    tables = mv_tables(d, settings)
    progress = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    rows = owned_tables.read_rows(progress, None, [codec.VNODE, codec.FINISHED]).to_pylist()
    return {"finished": {vnode_key(r[codec.VNODE], VNODES) for r in rows if r[codec.FINISHED]},
            "started": {vnode_key(r[codec.VNODE], VNODES) for r in rows}}


@pytest.mark.slow
@pytest.mark.spark
def test_dagster_dev_shows_the_tables_truthfully(spark, tmp_path, platform):
    since = time.time()
    vnodes = _small_platform(platform)
    finished, started = vnodes["finished"], vnodes["started"]
    assert finished == {"0", "1", "2", "3"} and started == finished | {"4", "5"}
    with dagster_dev(platform, str(tmp_path / "dagster_dev.log"), quiet=True,
                     port=free_port()) as url:
        keys = [{"path": [k]} for k in ("upstream_table", "replicated_state", "downstream_mv",
                                        "backfill_progress")]
        nodes = {n["assetKey"]["path"][0]: n
                 for n in graphql(url, ASSETS, {"keys": keys})["assetNodes"]}
        checks = graphql(url, CHECKS, {"key": {"path": ["downstream_mv"]},
                                       "name": CHECK_NAME})["assetCheckExecutions"]
        progress_checks = graphql(url, CHECKS, {"key": {"path": ["downstream_mv"]},
                                                "name": PROGRESS_CHECK})["assetCheckExecutions"]
        shown = graphql(url, CHECK_STATUS, {"keys": [{"path": ["downstream_mv"]}]})
        timeline = graphql(url, TIMELINE, {"filter": {
            "statuses": ["SUCCESS", "FAILURE", "CANCELED"], "updatedAfter": since}})
        workspace = graphql(url, WORKSPACE_JOBS)["workspaceOrError"]["locationEntries"]
    mv, progress = nodes["downstream_mv"], nodes["backfill_progress"]
    assert set(mv["assetPartitionStatuses"]["materializedPartitions"]) == finished
    assert set(mv["assetPartitionStatuses"]["unmaterializedPartitions"]) == \
        {vnode_key(v, VNODES) for v in range(VNODES)} - finished
    assert set(progress["assetPartitionStatuses"]["materializedPartitions"]) == started
    assert not mv["assetPartitionStatuses"]["failedPartitions"]
    assert not nodes["upstream_table"]["isMaterializable"]  # not offered: nothing to run

    latest = {e["label"]: e for e in mv["assetObservations"][0]["metadataEntries"]}
    assert latest["paused"]["boolValue"] is True  # the controls in force, before any barrier
    # the Overview shows the latest materialization: the last barrier's summary (no partition)
    (summary,) = mv["assetMaterializations"]
    barrier = {e["label"]: e for e in summary["metadataEntries"]}
    assert summary["partition"] is None
    assert 0 < barrier["percent_done"]["floatValue"] < 100
    assert barrier["vnodes_finished"]["intValue"] == 4
    assert barrier["vnodes_in_progress"]["intValue"] == 2
    assert barrier["vnode_states"]["text"] == \
        "finished 0..3; in progress 4..5; not started 6..7"
    assert barrier["mode"]["text"] == "arrangement" and barrier["mv_rows"]["intValue"] > 0
    assert {"lag_versions", "lag_seconds", "rows_per_second", "eta", "per_vnode"} <= set(barrier)
    assert barrier["upstream_version"]["intValue"] == 2

    evaluated = [c for c in checks if c["evaluation"]]
    assert len(evaluated) == 1 and evaluated[0]["status"] == "SUCCEEDED"
    assert evaluated[0]["evaluation"]["success"] is True
    assert "rows_compared" in {e["label"] for e in evaluated[0]["evaluation"]["metadataEntries"]}
    assert all(c["status"] == "SKIPPED" for c in checks if not c["evaluation"])
    # the barriers and the pause; the latest is a warning that says where the MV stands
    assert len(progress_checks) >= 3 and progress_checks[0]["status"] == "FAILED"
    latest = {e["label"] for e in progress_checks[0]["evaluation"]["metadataEntries"]}
    assert {"percent_done", "rows_per_second", "lag_versions", "vnodes_finished"} <= latest
    _assert_checks_shown(shown)
    _assert_timeline(timeline, workspace)


def _assert_checks_shown(shown: dict) -> None:
    """Both checks show their latest result on the asset page, not "Not evaluated"."""
    checks = {c["name"]: c["executionForLatestMaterialization"]
              for c in shown["assetNodes"][0]["assetChecksOrError"]["checks"]}
    assert checks[CHECK_NAME]["status"] == "SUCCEEDED"
    progress = checks[PROGRESS_CHECK]
    assert progress["status"] == "FAILED" and progress["evaluation"]["severity"] == "WARN"
    assert progress["evaluation"]["description"].startswith(f"4/{VNODES} vnodes finished, ")
    assert progress["evaluation"]["description"].endswith("% done, paused")


def _assert_timeline(timeline: dict, workspace: list) -> None:
    """Every run is drawn on the Timeline, in a row of a job the workspace serves."""
    runs = timeline["runsOrError"]["results"]
    assert len(runs) == 4 and all(r["status"] == "SUCCESS" for r in runs)
    served = {(e["name"], repo["name"], job["name"]) for e in workspace
              for repo in e["locationOrLoadError"]["repositories"] for job in repo["pipelines"]}
    drawn = {(r["repositoryOrigin"]["repositoryLocationName"],
              r["repositoryOrigin"]["repositoryName"], r["pipelineName"])
             for r in runs if r["repositoryOrigin"] and r["startTime"]}
    assert drawn == {("backfill_assets", "__repository__", job)
                     for job in (ASSET_JOB, "backfill_job", "verify_job", "set_controls_job")}
    assert drawn <= served


def test_after_a_reset_the_checks_read_not_finished_not_passed(platform, tmp_path):
    """After reset_mv_job the lineage summarises the MV's checks; with no result at all it drew
    a green "0 / 2 Passed". Read back through GraphQL as the lineage does: `backfill_finished`
    is a warning (0 vnodes finished), `matches_oracle` has no result, nothing passed."""
    settings, d, instance = loaded(platform)
    assert run_in_workspace(instance, "reset_mv_job", run_config={"ops": {"reset_mv": {
        "config": {"confirm": d.name}}}}).success
    with dagster_dev(platform, str(tmp_path / "dagster_dev.log"), quiet=True) as url:
        node = graphql(url, CHECK_STATUS, {"keys": [{"path": ["downstream_mv"]}]})
    checks = {c["name"]: c["executionForLatestMaterialization"]
              for c in node["assetNodes"][0]["assetChecksOrError"]["checks"]}
    assert checks[CHECK_NAME] is None
    progress = checks[PROGRESS_CHECK]
    assert progress["status"] == "FAILED" and progress["evaluation"]["severity"] == "WARN"
    assert progress["evaluation"]["description"].startswith(f"0/{VNODES} vnodes finished")


LAUNCH_BACKFILL = """mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL = """query Backfill($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status } } }"""
ALL_RUNS = """{ runsOrError(limit: 50) { ... on Runs { results { runId pipelineName status
  tags { key value } } } } }"""
RUN_LOG = """query Log($id: ID!) { logsForRun(runId: $id) { ... on EventConnection {
  events { ... on MessageEvent { message } } } } }"""


def _until(what: str, check, timeout: float = 480.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(3.0)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_ui_backfill_beside_the_running_sensor_never_collides(tmp_path, warehouse,
                                                                 dagster_home, monkeypatch):
    """What the new user did: `dagster dev` with the barrier sensor on over an unfinished MV,
    and a partition backfill of a vnode range launched through GraphQL (as "Materialize…" of
    a set does) at once. Whoever comes first, the other waits: the backfill ends Success, no
    run fails, and no run's log holds ConcurrentBackfillRun."""
    env = {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
           "BACKFILL_VNODE_COUNT": str(VNODES),
           "BACKFILL_MV_CONFIG": _mv_yaml(tmp_path, chunk_size=1000)}
    for key in ("BACKFILL_WAREHOUSE", "BACKFILL_VNODE_COUNT", "BACKFILL_MV_CONFIG"):
        monkeypatch.setenv(key, env[key])
    loaded(env)
    with dagster_dev(env, str(tmp_path / "dagster_dev.log")) as url:
        launched = graphql(url, LAUNCH_BACKFILL, {"params": {
            "assetSelection": [{"path": ["downstream_mv"]}],
            "partitionNames": [vnode_key(v, VNODES) for v in (2, 3)]}})
        backfill_id = launched["launchPartitionBackfill"]["backfillId"]
        ended = _until("the backfill", lambda: graphql(url, BACKFILL, {"id": backfill_id})[
            "partitionBackfillOrError"]["status"] not in ("REQUESTED", "CANCELING") and
            graphql(url, BACKFILL, {"id": backfill_id})["partitionBackfillOrError"])
        # the sensor's barrier over every vnode follows (it waited for vnodes 2..3)
        runs = _until("the sensor's barrier, done", lambda: (lambda rs: rs if any(
            r["pipelineName"] == "backfill_job" for r in rs) and all(
            r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in rs) else None)(
            graphql(url, ALL_RUNS)["runsOrError"]["results"]))
        logs = {r["runId"]: " ".join(e.get("message") or "" for e in graphql(
            url, RUN_LOG, {"id": r["runId"]})["logsForRun"]["events"]) for r in runs}
    assert ended["status"] == "COMPLETED_SUCCESS", ended
    assert all(r["status"] == "SUCCESS" for r in runs), runs
    assert not [i for i, text in logs.items() if "ConcurrentBackfillRun" in text]
