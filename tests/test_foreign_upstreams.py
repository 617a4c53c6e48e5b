"""Foreign writers and long histories: a duplicate pk arriving later is refused by name
(never silently lost), an MV over an MV works in both modes, and recovery finds a step's
progress however many commits followed it.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core import errors
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import STEP_METADATA_KEY, MVTables, read_rows
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows.commit import Change, Intent, commit
from tests.reliability import harness as H
from tests.support import assert_verified

pytestmark = pytest.mark.spark
ALL = list(range(H.VNODES))
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int32())])


def _foreign(warehouse: str, n: int = 40) -> str:
    uri = f"{warehouse}/foreign"
    rows = [{"id": i * 3, "name": f"n{i}", "qty": i % 7} for i in range(n)]
    write_deltalake(uri, pa.Table.from_pylist(rows, SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true"})
    return uri


def _mv(uri: str, warehouse: str, chunk: int = 4, name: str = "dup_mv",
        mode: str = "snapshot"):
    d = MVDefinition.from_dict({"name": name, "upstream": uri, "primary_key": ["id"],
                                "columns": ["id", "name", "qty"], "filter": "qty > 0",
                                "chunk_size": chunk, "vnode_count": H.VNODES, "mode": mode})
    return d, MVTables.under(warehouse, name, uri)


@pytest.mark.parametrize("when", ["in_progress", "finished"])
def test_duplicate_key_appended_later_is_refused_by_name(spark, warehouse, when):
    """A writer that does not enforce the pk appends a second row for key 0, which every
    vnode's backfill already covers (the smallest key is in its vnode's first chunk)."""
    uri = _foreign(warehouse)
    d, tables = _mv(uri, warehouse, chunk=4 if when == "in_progress" else 1000)
    run_barrier(spark, d, tables, ALL)
    write_deltalake(uri, pa.Table.from_pylist([{"id": 1000, "name": "ok", "qty": 3}], SCHEMA),
                    mode="append")  # a fresh key: fine
    run_barrier(spark, d, tables, ALL)
    assert_verified(spark, d, tables)
    write_deltalake(uri, pa.Table.from_pylist([{"id": 0, "name": "dup", "qty": 5}], SCHEMA),
                    mode="append")
    version = DeltaTable(uri).version()
    before = H.table_versions(tables)
    with pytest.raises(errors.BadPrimaryKeyInUpstream,
                       match=rf"version {version} inserts the primary key \(id=0\)"):
        run_barrier(spark, d, tables, ALL)
    assert H.table_versions(tables) == before, "something was written before the refusal"


@pytest.mark.parametrize("mode", ["arrangement", "no_shuffle"])
def test_mv_over_mv_in_both_modes(spark, warehouse, mode):
    """A chain upstream -> MV1 -> MV2; MV2 reads MV1 (no_shuffle: MV1's own vnode layout,
    which MV1's table records like a platform upstream does)."""
    live = H.orders(warehouse, 17)
    live.create(rows=60)
    raw1 = H.mv_raw("first", mode, 15, live.uri)
    d1, t1 = H.definition(raw1), H.tables_of(warehouse, raw1)
    raw2 = {"name": "second", "upstream": t1.mv, "primary_key": ["id"], "chunk_size": 20,
            "columns": ["id", "name_upper", "amount_x_qty"], "filter": "amount_x_qty > 100",
            "computed": [{"name": "twice", "expr": "amount_x_qty * 2"}],
            "mode": mode, "vnode_count": H.VNODES}
    d2, t2 = H.definition(raw2), H.tables_of(warehouse, raw2)
    for _ in range(7):
        live.apply(live.random_batch(6))
        run_barrier(spark, d1, t1, ALL)
        run_barrier(spark, d2, t2, ALL)
        assert_verified(spark, d1, t1)
        assert_verified(spark, d2, t2)
    done = read_rows(DeltaTable(t2.progress))["backfill_finished"].to_pylist()
    assert len(done) == H.VNODES and all(done)


class _Killed(Exception):
    pass


def _kill_at(point: str):
    def hook(at: str) -> None:
        if at == point:
            raise _Killed(at)
    return hook


def test_recovery_finds_progress_after_many_later_commits(spark, warehouse):
    """A step dies between its MV and progress commits; 210 MV commits of other vnode ranges
    follow (empty ones here: cheap, but each carries step metadata like a real one); the
    rerun still recovers the step's progress from its MV commit."""
    uri = _foreign(warehouse, 60)
    # chunked: the killed barrier still reads a chunk, so it makes an MV commit (snapshot
    # mode finished every vnode in the first barrier and has nothing to commit with no writes)
    d, tables = _mv(uri, warehouse, chunk=3, name="long_history", mode="arrangement")
    mine, others = ALL[:4], ALL[4:]
    run_barrier(spark, d, tables, ALL)
    with pytest.raises(_Killed):
        run_barrier(spark, d, tables, mine, hook=_kill_at("after_mv_commit"))
    version = DeltaTable(uri).version()
    fake = json.dumps({"version": version + 1000, "progress": {str(v): "{}" for v in others}})
    for _ in range(210):
        commit(TableVersion.load(tables.mv, None, {}), Change(),
               Intent({}, {STEP_METADATA_KEY: fake}))
    report = run_barrier(spark, d, tables, mine)
    assert sorted(report.recovered) == mine
    run_barrier(spark, d, tables, others)
    assert_verified(spark, d, tables)


@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_a_backquote_in_a_column_name(spark, warehouse, mode):
    """A column named with a backquote is selected, filtered on and computed from (written
    doubled in expressions, as Spark SQL quotes it); the MV equals the oracle."""
    uri = f"{warehouse}/quoted"
    schema = pa.schema([("id", pa.int64()), ("we`ird", pa.int32())])
    rows = [{"id": i, "we`ird": i % 5} for i in range(30)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    d = MVDefinition.from_dict({
        "name": "quoted_mv", "upstream": uri, "primary_key": ["id"],
        "columns": ["id", "we`ird"], "filter": "`we``ird` > 0",
        "computed": [{"name": "twice", "expr": "`we``ird` * 2"}],
        "chunk_size": 4, "vnode_count": H.VNODES, "mode": mode})
    tables = MVTables.under(warehouse, "quoted_mv", uri)
    run_barrier(spark, d, tables, ALL)
    write_deltalake(uri, pa.Table.from_pylist([{"id": 100, "we`ird": 3}], schema), mode="append")
    run_barrier(spark, d, tables, ALL)
    assert_verified(spark, d, tables)
