"""Re-snapshot on demand (barrier/resnapshot.py, resnapshot_job): a vnode range of a finished MV
re-read from the upstream's latest version repairs a drift there, is recorded as such, and
leaves the MV equal to the oracle; unfinished or foreign vnodes are refused, nothing written."""

from __future__ import annotations

import random

import dagster as dg
import pytest
from deltalake import DeltaTable

from backfill_assets.barrier.resnapshot import resnapshot
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import ResnapshotRefused
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.verify.oracle import verify
from jobs.resnapshot import build_resnapshot_job
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource
from tests.support import LiveUpstream, assert_verified, simple_mv, simple_row, simple_spec

VNODES = 8


def _finished(spark, warehouse: str, seed: int, mode: str = "snapshot", chunk_size: int = 10):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(seed),
                        simple_row, lambda rng: rng.randint(1, 10_000))
    live.create(rows=160)
    d = simple_mv(VNODES, mode=mode, chunk_size=chunk_size)
    tables = MVTables.under(warehouse, d.name, "orders")
    while not run_barrier(spark, d, tables, list(range(VNODES))).finished:
        pass
    return live, d, tables


def _drift(tables: MVTables, vnode: int) -> None:
    """Rows of `vnode` lost from the MV behind the platform's back (a suspected drift)."""
    DeltaTable(tables.mv).delete(f"vnode = {vnode}")


@pytest.mark.spark
def test_resnapshot_repairs_a_drifted_range_at_the_latest_version(spark, warehouse):
    live, d, tables = _finished(spark, warehouse, seed=51)
    live.apply(live.random_batch(20))  # the upstream moved on: re-read at its latest version
    _drift(tables, 2)
    assert [v.vnode for v in verify(spark, d, tables).failures()] == [2]
    latest = DeltaTable(live.uri).version()
    report = resnapshot(spark, d, tables, [2, 3])
    assert report.extra["resnapshot"] == f"vnodes 2..3 re-read at v{latest}"
    assert report.v_new == latest and set(report.progress) == {2, 3} and report.finished
    assert_verified(spark, d, tables)
    live.apply(live.random_batch(20))  # an ordinary barrier continues from there
    assert run_barrier(spark, d, tables, list(range(VNODES))).finished
    assert_verified(spark, d, tables)


@pytest.mark.spark
def test_resnapshot_refuses_unfinished_and_foreign_vnodes(spark, warehouse):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(52),
                        simple_row, lambda rng: rng.randint(1, 10_000))
    live.create(rows=160)
    d = simple_mv(VNODES, mode="arrangement", chunk_size=3)
    tables = MVTables.under(warehouse, d.name, "orders")
    run_barrier(spark, d, tables, list(range(VNODES)))
    before = DeltaTable(tables.mv).version()
    with pytest.raises(ResnapshotRefused, match="are not finished"):
        resnapshot(spark, d, tables, [0, 1])
    with pytest.raises(ResnapshotRefused, match="has vnodes 0..7"):
        resnapshot(spark, d, tables, [7, 8])
    assert DeltaTable(tables.mv).version() == before


@pytest.mark.spark
def test_resnapshot_job_records_it_on_the_asset(spark, warehouse, monkeypatch):
    """resnapshot_job (an arrangement-mode MV: any mode's finished vnodes can be re-read) says
    what it re-read and why in the MV's summary event and materializes those partitions."""
    monkeypatch.setenv("BACKFILL_WAREHOUSE", warehouse)
    live, d, tables = _finished(spark, warehouse, seed=53, mode="arrangement", chunk_size=40)
    _drift(tables, 5)
    settings = load_settings()
    monkeypatch.setattr("jobs.resnapshot.mv_tables", lambda *a, **k: tables)
    job = build_resnapshot_job(d, settings)
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(
        run_config={"ops": {"resnapshot_vnodes": {"config": {
            "first_vnode": 4, "last_vnode": 5, "reason": "suspected drift"}}}},
        instance=instance,
        resources={"spark": spark_resource(settings), "warehouse": warehouse_resource(settings)})
    assert result.success
    done = [e.event_specific_data.materialization for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION"]
    mv = [m for m in done if m.asset_key.path == ["downstream_mv"]]
    assert {m.partition for m in mv} == {"4", "5", None}  # None: the summary
    summary = mv[-1].metadata
    assert summary["resnapshot"].value.startswith("vnodes 4..5 re-read at v")
    assert summary["resnapshot_reason"].value == "suspected drift"
    said = [e.user_message for e in instance.all_logs(result.run_id)]
    # it says each step as it goes, not one line at the end
    assert any(m.startswith("re-snapshot of vnodes 4..5 starting") for m in said)
    assert any(m.startswith("re-snapshot for vnodes 4..5: backfill_progress committed") and
               "% done" in m for m in said), said
    assert_verified(spark, d, tables)
