"""The Dagster side, for real: `dagster job execute`, in-process materialize, the sensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import yaml
from deltalake import DeltaTable

from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.checks import build_oracle_check
from backfill_assets.wiring.partitions import vnode_partitions
from backfill_assets.wiring.sensors import build_barrier_sensor
from jobs.backfill import build_backfill_job
from resources.mv import load_mv_definition
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VNODES = 8


def _env(warehouse: str, dagster_home: str, mv_yaml: str) -> dict:
    return {**os.environ, "BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home,
            "BACKFILL_VNODE_COUNT": str(VNODES), "BACKFILL_MV_CONFIG": mv_yaml}


def _mv_yaml(tmp_path, chunk_size: int, **over) -> str:
    path = tmp_path / "mv.yaml"
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw.update(chunk_size=chunk_size, vnode_count=VNODES, **over)
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _execute(env: dict, job: str, *extra: str) -> str:
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "backfill_assets.definitions",
           "-j", job, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RUN_SUCCESS" in out, out[-3000:]
    return out


def test_job_execute_backfill_ranges_then_verify(tmp_path, warehouse, dagster_home):
    run_load(f"{warehouse}/upstream", LoadParams(seed=7, initial_rows=3000, versions=2,
                                                 changes_per_version=50), vnode_count=VNODES)
    env = _env(warehouse, dagster_home, _mv_yaml(tmp_path, chunk_size=250))
    tags = [json.dumps({"dagster/asset_partition_range_start": a,
                        "dagster/asset_partition_range_end": b})
            for a, b in (("0", "3"), ("4", "7"))]
    out = _execute(env, "backfill_job", "--tags", tags[0])
    assert "barrier v3 vnodes 0..3" in out
    run_load(f"{warehouse}/upstream", LoadParams(seed=8, versions=1, changes_per_version=40),
             vnode_count=VNODES)
    out = _execute(env, "backfill_job", "--tags", tags[1])
    assert "barrier v4 vnodes 4..7" in out
    out = _execute(env, "backfill_job")  # no range tag: all vnodes
    assert "vnodes 0..7" in out and f"{VNODES}/{VNODES} finished" in out
    out = _execute(env, "verify_job")
    assert f"over {VNODES} vnodes: 0 vnodes differ" in out
    # it says each stage as it goes (the log's order), not one line at the end
    stages = [out.index(s) for s in ("verifying MV", "verify: read the MV",
                                     "verify: recomputed", "0 vnodes differ")]
    assert stages == sorted(stages), out[-3000:]
    # the documented maintenance (compaction, DV garbage, lite vacuum, checkpoint) keeps it exact
    config = tmp_path / "maintain.yaml"
    config.write_text(yaml.safe_dump({"ops": {"maintain_tables": {"config": {
        "retention_hours": 0, "dv_keep_versions": 0, "dv_min_age_seconds": 0}}}}))
    _execute(env, "maintain_job", "-c", str(config))
    out = _execute(env, "verify_job")
    assert f"over {VNODES} vnodes: 0 vnodes differ" in out


def _events(result, kind: str) -> list:
    """(asset, partition, metadata) of the run's events of `kind`, in order."""
    out = []
    for e in result.all_events:
        if e.event_type_value != kind:
            continue
        data = e.event_specific_data
        ev = data.materialization if kind == "ASSET_MATERIALIZATION" else data.asset_observation
        out.append((ev.asset_key.path[0], ev.partition, ev.metadata))
    return out


def test_materialize_records_progress_per_vnode(spark, tmp_path, warehouse, monkeypatch):
    """A barrier of backfill_job leaves an unfinished vnode unmaterialized in the MV (and a
    not-started one everywhere); "Materialize" (Dagster's asset job) runs barriers until the
    vnodes asked for are finished, so each ends materialized. Each barrier's last MV event
    is its summary, with the per-vnode detail in one table."""
    run_load(f"{warehouse}/upstream", LoadParams(seed=9, initial_rows=800, versions=1,
                                                 changes_per_version=20), vnode_count=VNODES)
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = load_mv_definition(settings, _mv_yaml(tmp_path, chunk_size=40, mode="arrangement"))
    assets = build_assets(d, settings)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    instance = dg.DagsterInstance.ephemeral()
    job = dg.Definitions(assets=assets, jobs=[build_backfill_job(vnode_partitions(VNODES))],
                         resources=resources).resolve_job_def("backfill_job")
    one = job.execute_in_process(instance=instance, partition_key="3")  # one barrier
    assert one.success
    done = _events(one, "ASSET_MATERIALIZATION")
    assert [(a, p) for a, p, _ in done] == [  # the MV's own: the summary, no partition
        ("replicated_state", "3"), ("backfill_progress", "3"), ("downstream_mv", None)]
    meta = dict(done[1][2])
    assert meta["state"].value == "in progress" and meta["version"].value == 2
    assert len(meta) == 2  # the per-vnode detail is in the barrier's table
    barrier = done[-1][2]
    assert not _events(one, "ASSET_OBSERVATION")
    assert barrier["rows_read_from_snapshot"].value == 40 and barrier["mode"].value == \
        "arrangement"
    assert 0 < barrier["percent_done"].value < 100 and barrier["state"].value == "backfilling"
    assert barrier["vnode_states"].value == "in progress 3; not started 0..2, 4..7"
    assert barrier["mv_rows"].value > 0
    rows = barrier["per_vnode"].value.records
    assert [(r.data["vnode"], r.data["state"], r.data["row_count"]) for r in rows] == \
        [(3, "in progress", 40)]
    assert "read_bound_by_layout" not in barrier  # its replica is laid out for the seek
    progress_check = one.get_asset_check_evaluations()[0]  # a warning until all finished
    assert progress_check.check_name == "backfill_finished" and not progress_check.passed
    assert progress_check.metadata["vnodes_finished"].value == 0

    result = dg.materialize(assets, instance=instance, partition_key="3", resources=resources)
    assert result.success
    events = _events(result, "ASSET_MATERIALIZATION")
    last = events[-1]  # the summary, the latest materialization: the Overview shows it
    assert last[:2] == ("downstream_mv", None) and last[2]["vnodes_finished"].value == 1
    assert [r.data["state"] for r in last[2]["per_vnode"].value.records] == ["finished"]
    assert ("downstream_mv", "3") in {(a, p) for a, p, _ in events}  # finished: materialized
    assert not _events(result, "ASSET_OBSERVATION")
    # never observed: Dagster would then fetch its data versions, and an unranged run fails
    assert all(a != "upstream_table" for a, _, _ in events)
    check = dg.materialize([*assets, build_oracle_check(d, settings)], instance=instance,
                           selection=dg.AssetSelection.checks_for_assets("downstream_mv"),
                           resources=resources)
    evaluation = check.get_asset_check_evaluations()[0]
    assert evaluation.passed and evaluation.metadata["vnodes_compared"].value == VNODES


def test_materialize_says_when_the_upstream_layout_bounds_no_shuffle(spark, tmp_path, warehouse,
                                                                     monkeypatch):
    """no_shuffle over an upstream whose files each span their vnode's key range (one insert,
    then copy-on-write merges) reads every file for every chunk: the barrier says so, with
    the figures, in its metadata and log (core/read_cost.py; its row floor lowered to this
    table's size)."""
    from backfill_assets.core import read_cost

    monkeypatch.setattr(read_cost, "MIN_SCANNED_ROWS", 0)
    run_load(f"{warehouse}/upstream", LoadParams(seed=4, initial_rows=2000, versions=2,
                                                 changes_per_version=20), vnode_count=VNODES)
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = load_mv_definition(settings, _mv_yaml(tmp_path, chunk_size=100, mode="no_shuffle"))
    job = dg.Definitions(assets=build_assets(d, settings),
                         jobs=[build_backfill_job(vnode_partitions(VNODES))],
                         resources={"spark": spark_resource(settings),
                                    "warehouse": warehouse_resource(settings)}
                         ).resolve_job_def("backfill_job")
    result = job.execute_in_process(  # one barrier over all vnodes in one run
        instance=dg.DagsterInstance.ephemeral(),
        tags={"dagster/asset_partition_range_start": "0",
              "dagster/asset_partition_range_end": str(VNODES - 1)})
    assert result.success
    barrier = next(m for a, _, m in reversed(_events(result, "ASSET_OBSERVATION") +
                                             _events(result, "ASSET_MATERIALIZATION"))
                   if a == "downstream_mv" and "percent_done" in m)
    assert barrier["rows_read_from_snapshot"].value == 100
    scanned = barrier["snapshot_rows_scanned"].value
    assert scanned > 1000 and barrier["snapshot_read_amplification"].value == round(
        scanned / 100, 1)
    statement = barrier["read_bound_by_layout"].value
    assert f"decoded {scanned:,} upstream rows to take a chunk of 100" in statement
    assert "Mode 'arrangement'" in statement
    # its tasks run here (a local master): the read holds the next chunks, a window kept by
    # the change feed (storage/chunks/cut_window.py), and the statement counts one read per window
    window = barrier["snapshot_window_rows"].value
    assert window >= 400 and f"holds the next {window / 100:.1f} chunks" in statement


def test_barrier_sensor_turns_versions_into_ranged_runs(tmp_path, warehouse, monkeypatch):
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = load_mv_definition(settings, _mv_yaml(tmp_path, chunk_size=40))
    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=2)
    instance = dg.DagsterInstance.ephemeral()
    skipped = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(skipped, dg.SkipReason) and "does not exist" in skipped.skip_message
    run_load(f"{warehouse}/upstream", LoadParams(seed=1, initial_rows=100, versions=1,
                                                 changes_per_version=5), vnode_count=VNODES)
    ctx = dg.build_sensor_context(instance=instance)
    requests = sensor(ctx)
    assert [r.tags["dagster/asset_partition_range_start"] for r in requests] == ["0", "4"]
    assert [r.tags["dagster/asset_partition_range_end"] for r in requests] == ["3", "7"]
    version = DeltaTable(f"{warehouse}/upstream").version()
    assert all(f":v{version}:" in r.run_key for r in requests)
    assert all(r.run_config["ops"]["vnode_backfill"]["config"]["barrier_version"] == version
               for r in requests)
    again = sensor(dg.build_sensor_context(instance=instance, cursor=ctx.cursor))
    assert [r.run_key for r in again] == [r.run_key for r in requests]  # idempotent barrier
    assert json.loads(ctx.cursor)["version"] == version


def test_sensor_skips_a_current_mv_and_runs_at_once_on_a_resume(tmp_path, warehouse, monkeypatch):
    """No run for an MV at the upstream's latest version that is finished or paused (so `make
    ui` after `make demo` changes nothing); a resume is a new run key at the same versions."""
    from backfill_assets.mv.controls import Controls, write_controls
    from backfill_assets.wiring import sensors

    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = load_mv_definition(settings, _mv_yaml(tmp_path, chunk_size=40))
    run_load(f"{warehouse}/upstream", LoadParams(seed=1, initial_rows=100, versions=1,
                                                 changes_per_version=5), vnode_count=VNODES)
    version = DeltaTable(f"{warehouse}/upstream").version()
    sensor = build_barrier_sensor(d, settings, "backfill_job", ranges=1)
    instance = dg.DagsterInstance.ephemeral()
    monkeypatch.setattr(sensors, "_where", lambda progress, n: (version, False))  # finished
    skipped = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(skipped, dg.SkipReason) and "finished" in skipped.skip_message
    tables = sensors.mv_tables(d, settings)
    monkeypatch.setattr(sensors, "_where", lambda progress, n: (version, True))  # unfinished
    write_controls(tables, Controls(rate_limit=0))
    paused = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(paused, dg.SkipReason) and "paused" in paused.skip_message
    write_controls(tables, Controls())  # resume
    (resumed,) = sensor(dg.build_sensor_context(instance=instance))
    write_controls(tables, Controls(rate_limit=500))  # a new rate: another barrier at once
    (again,) = sensor(dg.build_sensor_context(instance=instance))
    assert resumed.run_key != again.run_key



def test_a_backfill_stopped_by_a_pause_reads_canceled_not_failed(spark, tmp_path, warehouse,
                                                                  monkeypatch):
    """A Dagster backfill's run (the asset pages' launch) over a paused MV: the run is green
    and says paused, its backfill reads Canceled with the reason (not a red Failure), and the
    barrier's figures say rate 0 beside `paused` (not the rate before the pause)."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from backfill_assets.mv.controls import Controls, write_controls
    from backfill_assets.wiring.assets import STOPPED_TAG
    from resources.mv import mv_tables

    run_load(f"{warehouse}/upstream", LoadParams(seed=9, initial_rows=800, versions=1,
                                                 changes_per_version=20), vnode_count=VNODES)
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    d = load_mv_definition(settings, _mv_yaml(tmp_path, chunk_size=40))
    assets = build_assets(d, settings)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    instance = dg.DagsterInstance.ephemeral()
    defs = dg.Definitions(assets=assets, resources=resources)
    assert dg.materialize(assets, instance=instance, partition_key="2",
                          resources=resources).success  # vnode 2 started and finished
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="paused", asset_graph=defs.get_repository_def().asset_graph,
        partition_names=["4"], asset_selection=[dg.AssetKey("downstream_mv")],
        backfill_timestamp=0.0, tags={}, dynamic_partitions_store=instance,
        all_partitions=False, title=None, description=None, run_config=None)
    instance.add_backfill(backfill)
    write_controls(mv_tables(d, settings), Controls(rate_limit=0))
    run = dg.materialize(assets, instance=instance, partition_key="4", resources=resources,
                         tags={"dagster/backfill": "paused"})
    assert run.success
    stopped = instance.get_backfill("paused")
    assert stopped.status == BulkActionStatus.CANCELED
    assert stopped.tags[STOPPED_TAG].startswith("stopped: the MV is paused")
    summary = [m for a, _, m in _events(run, "ASSET_OBSERVATION") if a == "downstream_mv"][-1]
    assert summary["state"].value == "paused" and summary["rows_per_second"].value == 0.0
