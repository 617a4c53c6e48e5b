"""What a warm process keeps between barriers for recovery gives the answers a fresh read does:
the progress rows its own commit wrote (only when that commit was the only one since), the
recovered state per table versions, the app transactions from the incremental log replay, and
the loads of pinned versions (a table recreated at the same uri is loaded afresh). No Spark.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from backfill_assets import storage
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.progress import BackfillState, Completed, InProgress
from backfill_assets.mv import owned_tables, recovery
from backfill_assets.storage import (
    KeyedRows,
    TableVersion,
    apply_keyed,
    clear_all,
    ensure_mor_table,
)

KO = KeyOrder((KeyColumn("id", "bigint"),))
VNODES = [0, 1, 2, 3]


def _fresh(table: DeltaTable) -> dict:
    clear_all()
    return recovery.read_progress(DeltaTable(table.table_uri), KO, VNODES)


def test_progress_rows_this_process_wrote_are_read_back_exactly(tmp_path):
    uri = str(tmp_path / "progress")
    table = owned_tables.ensure_table(uri, recovery.progress_schema(KO), {}, cdf=False)
    assert recovery.read_progress(table, KO, VNODES) == {}  # remembered: an empty table
    state = BackfillState(KO, VNODES)
    state.update(0, (7,), 3)
    state.finish(1, 0)
    for v in (0, 1):
        state.advance_version(v, 5)
    recovery.write_progress(table, state, KO, "m", VNODES, 5)
    remembered = recovery.read_progress(table, KO, VNODES)
    assert remembered == {0: (InProgress((7,), 3), 5), 1: (Completed(KO.placeholder(), 0), 5)}
    assert remembered == _fresh(table)
    # another writer's commit moves the version: the next read is a real read
    recovery.read_progress(table, KO, VNODES)
    row = {"vnode": 2, "id": 9, "backfill_finished": False, "row_count": 1, "version": 6}
    write_deltalake(uri, pa.Table.from_pylist([row], schema=recovery.progress_schema(KO)),
                    mode="overwrite", predicate="vnode IN (2)")
    seen = recovery.read_progress(DeltaTable(uri), KO, VNODES)
    assert seen[2] == (InProgress((9,), 1), 6) and seen == _fresh(table)


def test_app_transactions_from_the_replay_match_delta_rs(tmp_path):
    uri = str(tmp_path / "mv")
    schema = pa.schema([("id", pa.int64()), ("vnode", pa.int32())])
    ensure_mor_table(uri, schema, None, cdf=True, configuration={})
    for version in range(3):  # each commit read once by the incremental replay
        rows = pa.table({"id": [version], "vnode": [version]}, schema=schema)
        apply_keyed(TableVersion.load(uri), ["id"], owned_tables.intent("m", "mv", [version % 2],
                                                                 version), KeyedRows(
            rows.slice(0, 0), rows))
        table = DeltaTable(uri)
        got = owned_tables.txn_versions(table, "m", "mv", [0, 1, 2])
        assert got == {v: table.transaction_version(f"m/mv/{v}") for v in (0, 1, 2)}
    assert got == {0: 2, 1: 1, 2: None}


def test_a_table_recreated_at_the_same_uri_is_loaded_afresh(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [1]}))
    first = storage.open_table(uri, 0)
    assert storage.open_table(uri, 0) is first  # a pinned version is loaded once
    import shutil

    shutil.rmtree(uri)
    write_deltalake(uri, pa.table({"b": ["x", "y"]}))
    again = storage.open_table(uri, 0)
    assert again is not first and again.schema().to_arrow().names == ["b"]
    assert storage.latest_version(uri) == 0
    assert TableVersion.load(uri).version == 0  # the latest, by a listing


def test_a_progress_table_of_the_earlier_layout_keeps_its_vnode_partitions(tmp_path):
    """Progress tables of the earlier layout are vnode-partitioned delta-rs tables: they are
    still written per partition (not turned into merge-on-read tables) and read back."""
    uri = str(tmp_path / "progress")
    DeltaTable.create(uri, recovery.progress_schema(KO), partition_by=["vnode"])
    table = owned_tables.ensure_table(uri, recovery.progress_schema(KO), {}, cdf=False)
    assert table.metadata().partition_columns == ["vnode"]
    state = BackfillState(KO, VNODES)
    state.update(2, (4,), 1)
    state.advance_version(2, 3)
    recovery.write_progress(table, state, KO, "m", VNODES, 3)
    assert _fresh(table)[2] == (InProgress((4,), 1), 3)
    assert DeltaTable(uri).transaction_version("m/progress/2") == 3
    assert "deletionVectors" not in (DeltaTable(uri).protocol().reader_features or [])


def test_a_step_remembered_recovers_as_a_fresh_read_does(tmp_path):
    """`remember_step` (after a step's MV and progress commits) keeps what `recover_state`
    at those versions returns; the same recovery with every cache cleared agrees, and a
    commit by anyone else to the MV moves its version past the entry."""
    mv_uri, progress_uri = str(tmp_path / "mv"), str(tmp_path / "progress")
    schema = pa.schema([("id", pa.int64()), ("vnode", pa.int32())])
    ensure_mor_table(mv_uri, schema, None, cdf=True, configuration={})
    progress = owned_tables.ensure_table(progress_uri, recovery.progress_schema(KO), {}, cdf=False)
    recovery.read_progress(progress, KO, VNODES)  # as the step's recovery does
    state = BackfillState(KO, VNODES)
    state.update(0, (7,), 3)
    for v in VNODES[1:]:
        state.finish(v, 0)
    for v in VNODES:
        state.advance_version(v, 5)
    mv = DeltaTable(mv_uri)
    metadata = {owned_tables.STEP_METADATA_KEY: recovery.step_json(state, VNODES, 5, KO)}
    rows = pa.table({"id": [1], "vnode": [0]}, schema=schema)
    applied = apply_keyed(TableVersion.load(mv_uri), ["id"],
                          owned_tables.intent("m", "mv", VNODES, 5, metadata),
                          KeyedRows(rows.slice(0, 0), rows))
    recovery.write_progress(progress, state, KO, "m", VNODES, 5)
    recovery._RECOVERED.clear()  # the progress rows stay: remember_step builds on them
    recovery.remember_step(progress, mv, applied.version, "m", KO, VNODES)
    assert len(recovery._RECOVERED) == 1
    remembered = recovery.recover_state("m", KO, VNODES, progress, DeltaTable(mv_uri))
    clear_all()
    fresh = recovery.recover_state("m", KO, VNODES, DeltaTable(progress_uri),
                                   DeltaTable(mv_uri))
    assert remembered[1] == fresh[1] == []
    assert {v: (remembered[0].current(v), remembered[0].version(v)) for v in VNODES} == \
        {v: (fresh[0].current(v), fresh[0].version(v)) for v in VNODES}
    assert fresh[0].current(0) == InProgress((7,), 3)
    # another commit to the MV: the remembered entry is not the answer at its new version
    recovery._RECOVERED.clear()  # the progress rows stay: remember_step builds on them
    recovery.remember_step(progress, mv, applied.version, "m", KO, VNODES)
    apply_keyed(TableVersion.load(mv_uri), ["id"], owned_tables.intent("other", "mv", [2], 6),
                KeyedRows(rows.slice(0, 0), pa.table({"id": [2], "vnode": [2]}, schema=schema)))
    moved = recovery.recover_state("m", KO, VNODES, progress, DeltaTable(mv_uri))
    assert len(recovery._RECOVERED) == 2 and moved[0].version(2) == 5


def test_a_step_with_a_vnode_not_started_is_not_remembered(tmp_path):
    """A vnode without a progress row: a fresh recovery counts the MV commit's app transaction
    for it as redone, which the rows alone do not say, so nothing is remembered."""
    progress_uri = str(tmp_path / "progress")
    progress = owned_tables.ensure_table(progress_uri, recovery.progress_schema(KO), {}, cdf=False)
    recovery.read_progress(progress, KO, VNODES)
    state = BackfillState(KO, VNODES)
    state.update(0, (7,), 3)
    for v in VNODES:
        state.advance_version(v, 5)
    recovery.write_progress(progress, state, KO, "m", VNODES, 5)
    recovery._RECOVERED.clear()  # the progress rows stay: remember_step builds on them
    recovery.remember_step(progress, progress, 0, "m", KO, VNODES)
    assert len(recovery._RECOVERED) == 0


def test_the_progress_commit_is_not_fsynced_and_the_mv_commit_is(tmp_path, monkeypatch):
    """A progress commit can be lost at a power cut without losing anything (the MV commit
    before it carries the same progress and recovery completes it), so only the MV's log
    entry waits for the disk."""
    import os

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    mv_uri = str(tmp_path / "mv")
    ensure_mor_table(mv_uri, pa.schema([("id", pa.int64()), ("vnode", pa.int32())]), None,
                     cdf=True, configuration={})
    progress = owned_tables.ensure_table(str(tmp_path / "progress"), recovery.progress_schema(KO),
                                     {}, cdf=False)
    rows = pa.table({"id": [1], "vnode": [0]}, schema=pa.schema([("id", pa.int64()),
                                                                 ("vnode", pa.int32())]))
    synced.clear()
    apply_keyed(TableVersion.load(mv_uri), ["id"], owned_tables.intent("m", "mv", [0], 1),
                KeyedRows(rows.slice(0, 0), rows))
    assert len(synced) == 1
    state = BackfillState(KO, VNODES)
    state.update(0, (1,), 1)
    for v in VNODES:
        state.advance_version(v, 1)
    synced.clear()
    recovery.write_progress(progress, state, KO, "m", VNODES, 1)
    assert synced == [] and _fresh(progress)[0] == (InProgress((1,), 1), 1)
