"""Snapshot mode end to end: slices, the chunked path under a rate limit, history safety and
the re-snapshot of vnodes whose change feed was vacuumed mid-catch-up. Real Spark and Delta,
the independent oracle after every barrier."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from backfill_assets.barrier.runner import figures, run_barrier
from backfill_assets.core.progress import Completed
from backfill_assets.mv.controls import Controls, write_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.upstream.writer import DmlBatch, insert_rows
from backfill_assets.wiring.metadata import barrier_metadata
from tests.support import LiveUpstream, assert_verified, simple_mv, simple_row, simple_spec

VNODES = 8


def _setup(warehouse: str, seed: int, rows: int = 160, **extra):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(seed),
                        simple_row, lambda rng: rng.randint(1, 10_000))
    live.create(rows=rows)
    d = simple_mv(VNODES, mode="snapshot", chunk_size=5, **{"slice_rows": 50, **extra})
    return live, d, MVTables.under(warehouse, d.name, "orders")


def test_first_barrier_commits_slices_and_records_history_check(spark, warehouse):
    live, d, tables = _setup(warehouse, seed=31)
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    assert report.finished and report.snapshot_rows == 160
    assert report.extra["snapshot_path"] == "bulk"
    assert report.extra["bulk_engine"] == "arrow"  # the definition compiles: no JVM rows
    assert report.extra["slices_planned"] == report.extra["slices_done"] >= 3
    assert "| 1 | 0.." in report.extra["slices"]
    assert report.extra["history_safe"] is True and "ok" in report.extra["history_check"]
    mv = DeltaTable(tables.mv)
    steps = [c for c in mv.history() if c.get("backfill.step")]
    assert len(steps) == report.extra["slices_done"]  # one MV commit per slice
    meta = barrier_metadata(report, figures(d, tables, Controls(), report.v_new), Controls(), {})
    assert meta["slices_done"].value == report.extra["slices_done"]
    assert meta["snapshot_path"].text == "bulk"
    assert_verified(spark, d, tables)
    live.apply(live.random_batch(10))
    again = run_barrier(spark, d, tables, list(range(VNODES)))
    assert again.snapshot_rows == 0 and again.forwarded_rows > 0 and "slices_planned" not in \
        again.extra
    assert again.engine == "driver"  # a small barrier: no Spark job but the projection
    assert_verified(spark, d, tables)


def test_a_value_arrow_cannot_match_sends_the_slice_through_spark(spark, warehouse):
    """upper('straße') is 'STRASSE' in Spark (Java's case mapping) and 'STRAẞE' in Arrow:
    the slice holding it is refused by the Arrow projection, nothing of it is written, and
    Spark writes it; the other slices stay in Arrow. The MV equals the oracle."""
    live, d, tables = _setup(warehouse, seed=38)
    odd = {**simple_row(random.Random(1), 100_000), "name": "straße", "qty": 9}
    insert_rows(live.uri, pa.Table.from_pylist([odd]), spec=live.spec)
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    engines = report.extra["bulk_engine"]
    assert "arrow" in engines.split("; ") and "spark: upper() of a non-ASCII value" in engines
    assert_verified(spark, d, tables)
    mv = QueryBuilder().register("mv", DeltaTable(tables.mv)).execute(
        "select name_upper from mv where id = 100000").read_all()
    assert pa.table(mv).column("name_upper").to_pylist() == ["STRASSE"]


def test_short_retention_is_reported_at_risk(spark, warehouse):
    live, d, tables = _setup(warehouse, seed=32, rows=40)
    DeltaTable(live.uri).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 0 seconds"})
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    assert report.extra["history_safe"] is False
    assert "AT RISK" in report.extra["history_check"]


def test_rate_limit_selects_the_chunked_path_then_bulk_finishes(spark, warehouse):
    """Throttled: arrangement steps (positions per vnode); unthrottled again: each vnode's
    remainder after its position in one bulk read."""
    live, d, tables = _setup(warehouse, seed=33)
    write_controls(tables, Controls(rate_limit=16))
    started, rows = time.time(), 0
    for _ in range(2):
        report = run_barrier(spark, d, tables, list(range(VNODES)))
        assert report.extra["snapshot_path"] == \
            "chunked (arrangement steps): rate limit 16 rows/s"
        rows += report.snapshot_rows  # at most 16 rows per second since the change (pacing)
        assert 0 < report.snapshot_rows and rows <= 16 * (time.time() - started) + 16
        assert not report.finished
        assert_verified(spark, d, tables)
        live.apply(live.random_batch(8))
    write_controls(tables, Controls(rate_limit=0))
    paused = run_barrier(spark, d, tables, list(range(VNODES)))
    assert paused.extra["snapshot_path"].endswith("paused") and paused.snapshot_rows == 0
    write_controls(tables, Controls())
    live.apply(live.random_batch(8))
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    assert report.extra["snapshot_path"] == "bulk" and report.finished
    assert 0 < report.snapshot_rows < 160  # each vnode's remainder after its position
    assert_verified(spark, d, tables)


def test_catch_up_runs_in_steps_of_catch_up_rows(spark, warehouse):
    """A catch-up over many versions, with a budget of change rows one vnode's changes
    exceed: one step (one MV commit) per vnode range, each reading only its vnodes' change
    files; the MV equals the oracle, and a later barrier is an ordinary one again."""
    live, d, tables = _setup(warehouse, seed=36, catch_up_rows=1)
    assert run_barrier(spark, d, tables, list(range(VNODES))).finished
    for _ in range(4):
        live.apply(live.random_batch(12))
    def step_commits() -> int:  # the MV commits that carry a step's progress
        return sum(1 for c in DeltaTable(tables.mv).history() if c.get("backfill.step"))

    commits = step_commits()
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    assert report.forwarded_rows > 0 and report.snapshot_rows == 0
    assert report.extra["catch_up_steps"] > 2
    assert step_commits() - commits == report.extra["catch_up_steps"]
    assert_verified(spark, d, tables)
    live.apply(live.random_batch(8))
    one = run_barrier(spark, replace(d, catch_up_rows=1 << 20), tables, list(range(VNODES)))
    assert one.extra["catch_up_steps"] == 1 and one.forwarded_rows > 0
    assert_verified(spark, d, tables)


def test_vacuum_mid_catch_up_resnapshots_the_vnodes(spark, warehouse):
    """The change feed (v0, latest] is vacuumed after the snapshot: the next barrier cannot
    replay it, re-reads the vnodes at the latest version instead and says so. (delta-rs keeps
    `_change_data` files on vacuum: what goes is the data files of an append whose rows a later
    merge rewrote, which the change feed reads for the append's version.)"""
    live, d, tables = _setup(warehouse, seed=34)
    first = run_barrier(spark, d, tables, list(range(VNODES)))
    assert first.finished
    added = [live.make_row(live.rng, live.fresh_key()) for _ in range(20)]
    insert_rows(live.uri, pa.Table.from_pylist(added), spec=live.spec)  # an append version
    live.apply(DmlBatch(updates=[live.make_row(live.rng, r["id"]) for r in added]))
    live.apply(live.random_batch(10))
    removed = DeltaTable(live.uri).vacuum(retention_hours=0, enforce_retention_duration=False,
                                          dry_run=False)
    assert removed, "the DML removed no file: nothing was vacuumed"
    report = run_barrier(spark, d, tables, list(range(VNODES)))
    assert report.extra["resnapshot_vnodes"] == VNODES
    assert "re-read at v" in report.extra["resnapshots"] and report.forwarded_rows == 0
    assert report.snapshot_rows == len(live.keys)
    assert all(isinstance(p, Completed) for p in report.progress.values())
    meta = barrier_metadata(report, figures(d, tables, Controls(), report.v_new), Controls(), {})
    assert meta["resnapshot_vnodes"].value == VNODES
    assert_verified(spark, d, tables)
    live.apply(live.random_batch(8))  # afterwards an ordinary maintained MV again
    after = run_barrier(spark, d, tables, list(range(VNODES)))
    assert "resnapshots" not in after.extra and after.forwarded_rows > 0
    assert_verified(spark, d, tables)


@pytest.mark.parametrize("pk", [[{"name": "id", "descending": True}],
                                [{"name": "name", "descending": True}, "id"]])
def test_last_key_is_the_last_in_key_order(spark, warehouse, pk):
    """A bulk read finds each vnode's last key by an aggregate (no sort); it must be the key a
    chunked read ends on (same progress as arrangement reading everything in one chunk)."""
    _setup(warehouse, seed=35, rows=60)
    raw = {"primary_key": pk, "columns": ["id", "name", "amount", "qty"]}
    snap = simple_mv(VNODES, mode="snapshot", upstream="orders", **raw)
    arr = simple_mv(VNODES, mode="arrangement", chunk_size=1000, upstream="orders", **raw)
    got = {}
    for mv in (snap, arr):
        t = MVTables.under(warehouse, mv.name, "orders")
        report = run_barrier(spark, mv, t, list(range(VNODES)))
        assert report.finished
        got[mv.mode] = report.progress
    assert got["snapshot"] == got["arrangement"]


def test_catch_up_rounds_close_the_lag_the_writer_made_meanwhile(spark, warehouse):
    """The writer commits a version after every step of the barrier (after each slice, then
    after each catch-up step): the barrier coalesces what arrived during the slices in a
    catch-up round and stops once the lag no longer shrinks."""
    live, d, tables = _setup(warehouse, seed=36)

    def writer(point: str) -> None:
        if point == "after_progress_commit":
            live.apply(live.random_batch(4))

    report = run_barrier(spark, d, tables, list(range(VNODES)), hook=writer)
    slices = report.extra["slices_done"]
    assert report.finished and slices >= 3 and report.extra["catch_up_rounds"] >= 1
    assert report.forwarded_rows > 0  # the versions written during the slices
    assert report.extra["lag_versions"] <= 1
    assert_verified(spark, d, tables)


def test_a_selection_only_mv_projects_small_barriers_in_arrow_exactly(spark, warehouse):
    """No filter, no computed column: a small barrier's rows are selected in Arrow (no Spark
    job), and the MV still equals the oracle after updates, deletes and pk changes."""
    live, d, tables = _setup(warehouse, seed=37, rows=80, filter=None, computed=[])
    run_barrier(spark, d, tables, list(range(VNODES)))
    for _ in range(2):
        live.apply(live.random_batch(12))
        report = run_barrier(spark, d, tables, list(range(VNODES)))
        assert report.engine == "driver" and report.forwarded_rows > 0
        assert_verified(spark, d, tables)


def test_the_benchmarks_scale_check_agrees_with_the_oracle(spark, warehouse):
    """benchmarks.scale_check (per-vnode fingerprints, for sizes the oracle cannot hold) passes
    on an MV the oracle passes, and names the vnode of a row the MV should not hold."""
    from backfill_assets.storage import Intent, TableVersion, apply_changes, spark_schema
    from benchmarks.scale_check import scale_check

    live, d, tables = _setup(warehouse, seed=47)
    run_barrier(spark, d, tables, list(range(VNODES)))
    live.apply(live.random_batch(40))
    run_barrier(spark, d, tables, list(range(VNODES)))
    assert_verified(spark, d, tables)
    good = scale_check(spark, d, tables)
    assert good["ok"] and good["vnodes"] == VNODES and good["rows"] > 0, good
    mv = TableVersion.load(tables.mv)
    first = pa.table(QueryBuilder().register("t", DeltaTable(tables.mv))
                     .execute("select * from t limit 1").read_all())
    first = first.select(mv.arrow_schema.names).cast(mv.arrow_schema)
    key = d.primary_key[0].name
    stray = first.set_column(first.schema.get_field_index(key), key,
                             pa.array([10**9], first.schema.field(key).type))
    apply_changes(spark, mv, [k.name for k in d.primary_key], Intent({"tamper/0": 1}),
                  inserts=spark.createDataFrame(stray, schema=spark_schema(stray.schema)),
                  rows_hint=1)
    bad = scale_check(spark, d, tables)
    assert not bad["ok"] and bad["mismatched"] == [stray.column("vnode")[0].as_py()], bad
