"""The rows a process holds of an aggregate MV's tables between barriers (aggregate/held.py)
equal a fresh read of each table after every barrier (random DML with group moves, deletes of
the current extremes, nulls, a resnapshot), and are dropped on any version the process did
not write on top of them: another writer's commit (a compaction outside the store), a
recreated table at the same uri (another id), a barrier killed mid-commit."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets import storage
from backfill_assets.aggregate import checkpoint, held
from backfill_assets.aggregate.projection import projection_of
from backfill_assets.aggregate.store import STATE, AggregateStore, settle
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls
from backfill_assets.step.preflight import checked_upstream
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact, extremes_batch
from tests.reliability import harness as H


def _store(spark, d, tables) -> AggregateStore:
    upstream = checked_upstream(tables, d, None)
    proj = projection_of(spark, d, upstream.schema, upstream.key_order)
    return AggregateStore(d.name, tables, proj.tables, d.vnode_count)


def _first_barrier(spark, warehouse: str, seed: int, name: str, rows: int):
    """An orders upstream of ``rows`` rows, its aggregate MV after the bulk barrier, and the
    MV's store."""
    live = H.orders(warehouse, seed)
    live.create(rows=rows)
    raw = aggregate_raw(name, live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    return live, d, tables, _store(spark, d, tables)


def _sorted(rows: pa.Table, key: tuple[str, ...]) -> list[dict]:
    return rows.sort_by([(k, "ascending") for k in key]).to_pylist()


def _assert_held_equals_a_fresh_read(store: AggregateStore) -> int:
    """Every table is held at its latest version, row for row what a read of its files gives,
    once the compactions a barrier left running in the background have ended (each moves its
    table's held rows to the version it commits: `settle` is what the MV's next barrier does
    first)."""
    settle(store)
    held_tables = 0
    for phase in store.phases:
        t = store.table(phase)
        snap = storage.TableVersion.load(t.uri, None, store.tables.storage_options)
        rows = held.rows_at(t.uri, snap.table.metadata().id, snap.version)
        assert rows is not None, f"{phase} not held at its latest version {snap.version}"
        fresh = owned_tables.read_rows(snap.table).select(t.schema.names).cast(t.schema)
        assert rows.schema == fresh.schema
        assert _sorted(rows, t.key) == _sorted(fresh, t.key), phase
        keys = {tuple(r.values()) for r in rows.select(list(t.key)).to_pylist()}
        assert len(keys) == rows.num_rows, phase
        held_tables += 1
    return held_tables


def test_held_tables_equal_a_fresh_read_after_every_barrier(spark, warehouse):
    rng = random.Random(4901)
    live, d, tables, store = _first_barrier(spark, warehouse, 4901, "agg_held", 300)
    assert _assert_held_equals_a_fresh_read(store) == 3  # state, kept input, MV
    tops: list[int] = []
    for n in range(5):
        live.apply(extremes_batch(live, rng, tops))
        if n == 2:
            live.apply(live.random_batch(10))  # two versions in one barrier
        report = run_barrier(spark, d, tables, [0])
        assert report.extra["aggregate_path"] == "apply"
        _assert_held_equals_a_fresh_read(store)
        assert_exact(spark, d, tables)
    live.delete_where(lambda k: k % 4 == 0)
    forced = run_barrier(spark, d, tables, [0], overrides=Controls(barrier_choice="resnapshot"))
    assert forced.extra["aggregate_path"] == "recompute"
    _assert_held_equals_a_fresh_read(store)
    assert_exact(spark, d, tables)


def test_a_version_the_process_did_not_write_is_never_answered(spark, warehouse, monkeypatch):
    rng = random.Random(4902)
    live, d, tables, store = _first_barrier(spark, warehouse, 4902, "agg_held_other", 200)
    state = store.table(store.phases[0])
    live.apply(extremes_batch(live, rng, []))
    # a second file and a DV, so there is what to compact (no keyed rewrite: it leaves one
    # file and no DV; a checkpoint at this barrier: the bulk's was the last one)
    monkeypatch.setattr(storage.keyed_rewrite, "REWRITE_SHARE", 2.0)
    monkeypatch.setattr(checkpoint, "CHECKPOINT_BARRIERS", 1)
    run_barrier(spark, d, tables, [0])
    monkeypatch.undo()
    # another writer: a compaction outside the store moves the version
    snap = storage.TableVersion.load(state.uri, None, tables.storage_options)
    table_id = snap.table.metadata().id
    assert held.rows_at(state.uri, table_id, snap.version) is not None
    moved = storage.compact(spark, snap, list(state.key), force=True)
    assert moved.version == snap.version + 1
    assert held.rows_at(state.uri, table_id, moved.version) is None
    live.apply(extremes_batch(live, rng, []))
    run_barrier(spark, d, tables, [0])  # reads the files, holds them again
    _assert_held_equals_a_fresh_read(store)
    assert_exact(spark, d, tables)
    # a barrier killed inside its MV commit (its state not committed: between checkpoints)
    # leaves the held rows valid for the table
    live.apply(extremes_batch(live, rng, []))

    def kill(point: str) -> None:
        if point == "mv_dv_file_written":
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        run_barrier(spark, d, tables, [0], hook=kill)
    _assert_held_equals_a_fresh_read(store)
    run_barrier(spark, d, tables, [0])
    _assert_held_equals_a_fresh_read(store)
    assert_exact(spark, d, tables)
    # the same uri and version under another table id is not the held table
    now = storage.TableVersion.load(state.uri, None, tables.storage_options)
    assert held.rows_at(state.uri, "another-table-id", now.version) is None


def test_the_state_between_checkpoints_is_replayed_by_a_process_without_it(spark, warehouse):
    """Barriers between two checkpoints commit the MV and the progress alone (the state table
    stays at its checkpoint, aggregate/checkpoint.py); a process that does not hold the state
    (here: every process cache dropped) replays the change feed from the checkpoint into it
    and checkpoints at its barrier; the MV is exact throughout."""
    rng = random.Random(4903)
    live, d, tables, store = _first_barrier(spark, warehouse, 4903, "agg_checkpoint", 200)
    tops: list[int] = []
    flags = []
    for n in range(checkpoint.CHECKPOINT_BARRIERS + 2):
        live.apply(extremes_batch(live, rng, tops))
        report = run_barrier(spark, d, tables, [0])
        flags.append(report.extra["state_checkpoint"])
        if n % 3 == 1:
            assert_exact(spark, d, tables)
    every = checkpoint.CHECKPOINT_BARRIERS
    # the bulk's whole commit of the state is a checkpoint this process holds: the first
    # commit of the state after it is the CHECKPOINT_BARRIERS-th barrier
    assert flags == [*[False] * (every - 1), True, False, False], flags
    behind = store.txn_version(STATE, range(d.vnode_count))
    assert behind is not None and behind < report.v_new
    at = report.v_new
    storage.clear_all()  # a new process: nothing held
    live.apply(extremes_batch(live, rng, tops))
    report = run_barrier(spark, d, tables, [0])
    assert report.extra["state_replayed"] == [behind, at], report.extra
    assert report.extra["state_checkpoint"] is True
    assert store.txn_version(STATE, range(d.vnode_count)) == report.v_new
    assert_exact(spark, d, tables)
    live.apply(extremes_batch(live, rng, tops))
    assert run_barrier(spark, d, tables, [0]).extra["state_checkpoint"] is False
    assert_exact(spark, d, tables)
