"""The demo's aggregate MV (jobs/configs/mvs/revenue_by_region_day.yaml: revenue and orders per
region per day) through real Dagster: backfill_job barriers in process over the demo's load
generator, then the `matches_oracle` check (Spark's GROUP BY) passes and the barrier's metadata
says which path it took."""

from __future__ import annotations

import os

import dagster as dg
import yaml

from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.checks import build_oracle_check
from backfill_assets.wiring.partitions import vnode_partitions
from jobs.backfill import build_backfill_job
from resources.mv import load_mv_definition
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VNODES = 8


def _summary(result) -> dict:
    """The metadata of the run's last MV materialization (the barrier's summary)."""
    events = [e.event_specific_data.materialization for e in result.all_events
              if e.event_type_value == "ASSET_MATERIALIZATION"]
    mv = [m for m in events if m.asset_key.path[0] == "downstream_mv"]
    return {k: v.value for k, v in mv[-1].metadata.items()}


def test_the_demo_aggregate_mv_through_dagster(spark, tmp_path, warehouse, monkeypatch):
    run_load(f"{warehouse}/upstream", LoadParams(seed=11, initial_rows=1500, versions=1,
                                                 changes_per_version=40), vnode_count=VNODES)
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    settings = load_settings()
    config = os.path.join(ROOT, "jobs", "configs", "mvs", "revenue_by_region_day.yaml")
    with open(config, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    path = tmp_path / "agg_mv.yaml"
    path.write_text(yaml.safe_dump({**raw, "vnode_count": VNODES}))
    d = load_mv_definition(settings, str(path))
    assert d.is_aggregate
    assets = build_assets(d, settings)
    resources = {"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)}
    instance = dg.DagsterInstance.ephemeral()
    job = dg.Definitions(assets=assets, jobs=[build_backfill_job(vnode_partitions(VNODES))],
                         resources=resources).resolve_job_def("backfill_job")
    first = job.execute_in_process(instance=instance, partition_key="3")
    assert first.success
    summary = _summary(first)
    assert summary["aggregate_path"] == "bulk" and summary["groups"] > 10
    run_load(f"{warehouse}/upstream", LoadParams(seed=12, versions=2, changes_per_version=30),
             vnode_count=VNODES)
    second = job.execute_in_process(instance=instance, partition_key="5")
    assert second.success
    assert _summary(second)["aggregate_path"] == "apply"
    check = dg.materialize([*assets, build_oracle_check(d, settings)], instance=instance,
                           selection=dg.AssetSelection.checks_for_assets("downstream_mv"),
                           resources=resources)
    evaluation = check.get_asset_check_evaluations()[0]
    assert evaluation.passed, evaluation.metadata
    assert evaluation.metadata["rows_compared"].value > 10
