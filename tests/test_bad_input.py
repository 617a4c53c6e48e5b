"""Bad input: every case is refused with a named error whose message says what to do, and
nothing is written (the MV, replica and progress tables keep their Delta versions, or do not
exist). The one exception is an added upstream column the MV does not use: it is tolerated.

Real Spark, real Delta tables in a temporary warehouse; upstreams written by "another engine"
are plain `deltalake` writes that bypass the platform's DML checks.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
import random
import re
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, write_deltalake

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core import errors
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables, read_rows
from backfill_assets.upstream.writer import DmlBatch, insert_rows
from tests.reliability import harness as H

pytestmark = pytest.mark.spark
ALL = list(range(H.VNODES))


@pytest.fixture
def built(spark, warehouse):
    """An upstream and an MV that already ran two barriers (arrangement unless overridden)."""

    def build(mode: str = "arrangement", vnodes=ALL, barriers: int = 2, seed: int = 31):
        live = H.orders(warehouse, seed)
        live.create(rows=80)
        raw = H.mv_raw(f"bad_{mode}", mode, 5, live.uri)
        d, tables = H.definition(raw), H.tables_of(warehouse, raw)
        for _ in range(barriers):
            live.apply(live.random_batch(5))
            run_barrier(spark, d, tables, vnodes)
        return live, d, tables

    return build


def refused(spark, d, tables, error, match: str, vnodes=ALL, version=None) -> None:
    """The named error, a message matching `match` (what to do), and no table written."""
    before = H.table_versions(tables)
    with pytest.raises(error) as caught:
        run_barrier(spark, d, tables, vnodes, version=version)
    assert re.search(match, str(caught.value)), str(caught.value)
    assert H.table_versions(tables) == before, "something was written before the refusal"


def _foreign(uri: str, rows: list[dict], schema: pa.Schema, cdf: bool = True) -> None:
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(uri, pa.Table.from_pylist(rows, schema), configuration=config)


FOREIGN = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                     ("qty", pa.int32())])


def _foreign_rows(n: int, start: int = 1) -> list[dict]:
    rng = random.Random(n)
    return [{"id": i, "name": rng.choice(["ann", "bob"]), "amount": Decimal("1.50"),
             "qty": rng.randint(0, 9)} for i in range(start, start + n)]


def _foreign_mv(warehouse: str, uri: str, name: str = "foreign_mv"):
    raw = H.mv_raw(name, "arrangement", 5, uri)
    return H.definition(raw), MVTables.under(warehouse, name, uri)


# ----------------------------------------------------------------------- change data feed


def test_upstream_without_change_data_feed(spark, warehouse):
    uri = f"{warehouse}/nocdf"
    _foreign(uri, _foreign_rows(20), FOREIGN, cdf=False)
    d, tables = _foreign_mv(warehouse, uri)
    refused(spark, d, tables, errors.ChangeFeedDisabled, r"enable it .*and rerun")
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}


def test_change_data_feed_turned_off_later(spark, built):
    live, d, tables = built()
    DeltaTable(live.uri).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})
    live.apply(live.random_batch(3))
    refused(spark, d, tables, errors.ChangeFeedDisabled, r"enable it")


# ------------------------------------------------------------------------------- history


def test_history_vacuumed_for_the_range(spark, built):
    """Rows appended after the MV's version, then rewritten and vacuumed: the change feed of
    the append is gone."""
    live, d, tables = built()
    appended = [
        {"id": 200_000 + i, "name": "x", "amount": Decimal("2.00"), "qty": 5,
         "day": dt.date(2025, 1, 1)} for i in range(40)]
    insert_rows(live.uri, pa.Table.from_pylist(appended), spec=live.spec)
    live.keys.update(r["id"] for r in appended)
    live.apply(DmlBatch(updates=[{"id": r["id"], "qty": 7} for r in appended]))
    removed = DeltaTable(live.uri).vacuum(retention_hours=0, enforce_retention_duration=False,
                                          dry_run=False)
    assert removed
    refused(spark, d, tables, errors.HistoryUnavailable,
            r"rebuild .*keep history longer|use a later version")


def test_change_files_removed_for_the_range(spark, built):
    live, d, tables = built()
    live.apply(live.random_batch(6))
    for f in glob.glob(os.path.join(live.uri, "_change_data", "**", "*.parquet"), recursive=True):
        os.remove(f)  # what a VACUUM of another engine does to _change_data
    refused(spark, d, tables, errors.HistoryUnavailable, r"no longer available.*rebuild")


def test_log_cleaned_for_the_range(spark, built):
    live, d, tables = built()
    at = DeltaTable(live.uri).version()
    for _ in range(2):
        live.apply(live.random_batch(4))
    DeltaTable(live.uri).create_checkpoint()
    for v in range(at + 1, DeltaTable(live.uri).version()):
        os.remove(os.path.join(live.uri, "_delta_log", f"{v:020d}.json"))
    refused(spark, d, tables, errors.HistoryUnavailable, r"later version or rebuild|rebuild")


# -------------------------------------------------------------------------- schema change


def _rewrite_upstream(uri: str, change) -> None:
    """Another engine rewrites the upstream with a new schema (keeps partitioning and CDF)."""
    table = change(read_rows(DeltaTable(uri)))
    write_deltalake(uri, table, mode="overwrite", schema_mode="overwrite",
                    partition_by=["vnode"])


def test_added_columns_not_in_the_mv_are_tolerated(spark, built):
    """Even of a type the platform cannot carry: the MV never reads them."""
    live, d, tables = built()
    DeltaTable(live.uri).alter.add_columns([Field("note", "string", nullable=True),
                                            Field("blob", "binary", nullable=True)])
    extra = [{"id": 300_000 + i, "name": "ann", "amount": Decimal("3.00"), "qty": 4,
              "day": dt.date(2025, 2, 1), "vnode": live.spec.vnode_of((300_000 + i,)),
              "note": f"n{i}", "blob": b"\x01"} for i in range(10)]
    schema = DeltaTable(live.uri).schema().to_arrow()
    write_deltalake(live.uri, pa.Table.from_pylist(extra, pa.schema(schema)), mode="append")
    live.keys.update(r["id"] for r in extra)
    for _ in range(30):
        live.apply(live.random_batch(4))
        report = run_barrier(spark, d, tables, ALL)
        H.assert_oracle(spark, d, tables, "after added columns")
        if report.finished:
            break
    assert report.finished
    assert {"note", "blob"}.isdisjoint(H._open(tables.mv).schema().to_arrow().names)


def test_dropped_column_stops_the_mv(spark, built):
    live, d, tables = built()
    _rewrite_upstream(live.uri, lambda t: t.drop_columns(["name"]))
    refused(spark, d, tables, errors.UpstreamSchemaChanged,
            r"dropped column 'name', which MV '\w+' reads; restore the column, or rebuild")


def test_retyped_column_stops_the_mv(spark, built):
    live, d, tables = built()

    def retype(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("qty")
        return t.set_column(i, pa.field("qty", pa.int64()), t["qty"].cast(pa.int64()))

    _rewrite_upstream(live.uri, retype)
    refused(spark, d, tables, errors.UpstreamSchemaChanged,
            r"changed column 'qty' from int to bigint.*restore the type")


def test_unsupported_column_type(spark, warehouse):
    """A nested column is refused by name only when the MV reads it (here: selects it); an MV
    over the same upstream that does not read it is built as usual."""
    uri = f"{warehouse}/blobs"
    schema = FOREIGN.append(pa.field("payload", pa.list_(pa.string())))  # binary is supported
    _foreign(uri, [{**r, "payload": ["x"]} for r in _foreign_rows(10)], schema)
    raw = {**H.mv_raw("reads_payload", "arrangement", 5, uri),
           "columns": ["id", "name", "amount", "qty", "payload"]}
    d, tables = H.definition(raw), MVTables.under(warehouse, raw["name"], uri)
    refused(spark, d, tables, errors.UnsupportedColumnType,
            r"reads column 'payload' of type list<.*leave it out of the MV's columns")
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}
    d, tables = _foreign_mv(warehouse, uri)
    assert any(run_barrier(spark, d, tables, ALL).finished for _ in range(3))
    H.assert_oracle(spark, d, tables, "beside an unread list column")


# ------------------------------------------------------------- null / duplicate primary key

NULLABLE = pa.schema([pa.field("id", pa.int64(), nullable=True), *list(FOREIGN)[1:]])


def test_null_pk_arriving_in_the_change_feed(spark, warehouse):
    uri = f"{warehouse}/nullable"
    _foreign(uri, _foreign_rows(30), NULLABLE)
    d, tables = _foreign_mv(warehouse, uri)
    run_barrier(spark, d, tables, ALL)
    write_deltalake(uri, pa.Table.from_pylist([{"id": None, "name": "x", "amount": Decimal("1"),
                                                 "qty": 3}], NULLABLE), mode="append")
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            r"null primary-key column 'id'.*fix those rows in the upstream")


def _vnode_of_null(spark) -> int:
    from backfill_assets.core.vnode import spark_vnode_sql

    sql = spark_vnode_sql(["id"], ["bigint"], H.VNODES)
    return spark.sql(f"SELECT {sql.replace('`id`', 'id')} AS v FROM "
                     "(SELECT CAST(NULL AS BIGINT) AS id)").first()["v"]


def test_null_pk_in_the_snapshot(spark, warehouse):
    uri = f"{warehouse}/nullable"
    _foreign(uri, [*_foreign_rows(30), {"id": None, "name": "x", "amount": Decimal("1"),
                                        "qty": 3}], NULLABLE)
    d, tables = _foreign_mv(warehouse, uri)
    bad = _vnode_of_null(spark)
    run_barrier(spark, d, tables, [v for v in ALL if v != bad])  # state exists
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            r"null primary key.*fix those rows in the upstream", vnodes=[bad])


def _duplicate(live, key: int) -> pa.Table:
    """One version of another engine: two rows with the primary key `key`."""
    row = {"id": key, "name": "dup", "amount": Decimal("9.00"), "qty": 9,
           "day": dt.date(2025, 3, 3), "vnode": live.spec.vnode_of((key,))}
    return pa.Table.from_pylist([row, {**row, "name": "dup2"}], live.spec.arrow_schema())


@pytest.mark.parametrize("mode", ["arrangement", "no_shuffle", "snapshot"])
def test_duplicate_pk_arriving_in_the_change_feed(spark, built, mode):
    live, d, tables = built(mode)
    write_deltalake(live.uri, _duplicate(live, 400_000), mode="append")
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            r"\(id=400000\) 2 times .*fix those rows in the upstream")


@pytest.mark.parametrize("mode", ["arrangement", "no_shuffle", "snapshot"])
def test_duplicate_pk_in_the_snapshot(spark, warehouse, mode):
    live = H.orders(warehouse, 32)
    live.create(rows=60)
    key = sorted(live.keys)[0]
    row = _duplicate(live, key).slice(0, 1)
    write_deltalake(live.uri, row, mode="append")  # the key now has two rows
    raw = H.mv_raw(f"dup_{mode}", mode, 5, live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    bad = live.spec.vnode_of((key,))
    others = [v for v in ALL if v != bad]
    run_barrier(spark, d, tables, others)  # the other vnodes start fine: state exists
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            rf"2 rows with the primary key \(id={key}\).*fix those rows", vnodes=[bad])


def test_duplicate_pk_reaching_a_started_vnode(spark, built):
    """No-shuffle reads the upstream itself: a key another engine appends a second time after
    every vnode started passes the change-feed check (one insert per version); the check of
    keys inserted into started vnodes catches it (tests/test_foreign_upstreams.py covers keys
    the position already passed)."""
    live, d, tables = built("no_shuffle", barriers=1)  # the 5 smallest keys are read
    key = sorted(live.keys)[5]  # the next chunk starts here
    write_deltalake(live.uri, _duplicate(live, key).slice(0, 1), mode="append")
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            rf"2 rows with the primary key \(id={key}\).*fix those rows")


# ---------------------------------------------------------------------------- state on disk


def _edit_progress(tables, edit, schema_mode: str | None = None) -> None:
    table = DeltaTable(tables.progress)
    rows = read_rows(table)
    edited = edit(rows)
    kwargs = {"schema_mode": schema_mode} if schema_mode else {}
    write_deltalake(tables.progress, edited, mode="overwrite", **kwargs)


def _set(rows: pa.Table, vnode: int, **values) -> pa.Table:
    out = rows.to_pylist()
    for r in out:
        if r["vnode"] == vnode:
            r.update(values)
    return pa.Table.from_pylist(out, rows.schema)


CORRUPTIONS = {
    "two rows for one vnode": (
        lambda t: pa.concat_tables([t, t.filter(pa.compute.equal(t["vnode"], 3))]), None,
        errors.CorruptProgressRow, r"two progress rows for vnode 3.*RESTORE"),
    "unfinished with a null position": (
        lambda t: _set(t, 2, id=None, backfill_finished=False), None,
        errors.CorruptProgressRow, r"null pk.*drop the MV's state"),
    "negative row count": (
        lambda t: _set(t, 4, row_count=-5), None,
        errors.CorruptProgressRow, r"row_count -5.*drop the MV's state"),
    "version missing": (
        lambda t: _set(t, 1, version=None), None,
        errors.CorruptProgressRow, r"version None.*drop the MV's state"),
    "a column dropped": (
        lambda t: t.drop_columns(["row_count"]), "overwrite",
        errors.ProgressSchemaMismatch, r"missing columns \['row_count'\].*drop the MV's state"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_or_hand_edited_progress(spark, built, case):
    edit, schema_mode, error, match = CORRUPTIONS[case]
    live, d, tables = built()
    _edit_progress(tables, edit, schema_mode)
    live.apply(live.random_batch(3))
    refused(spark, d, tables, error, match)


def test_vnode_count_changed_under_existing_state(spark, built):
    live, d, tables = built()
    raw = {**H.mv_raw(d.name, d.mode, d.chunk_size, live.uri), "vnode_count": 16}
    refused(spark, MVDefinition.from_dict(raw), tables, errors.VnodeCountChanged,
            r"built with 8 vnodes.*set vnode_count back to 8", vnodes=list(range(16)))


def test_warehouse_that_is_not_writable(spark, warehouse, tmp_path):
    """A warehouse below a regular file: no user can create it (permission bits alone would
    not stop root, which runs these tests)."""
    live = H.orders(warehouse, 33)
    live.create(rows=20)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    raw = H.mv_raw("unwritable", "arrangement", 5, live.uri)
    tables = MVTables.under(str(blocker / "warehouse"), raw["name"], live.uri)
    refused(spark, H.definition(raw), tables, errors.WarehouseNotWritable,
            r"is not writable; point BACKFILL_WAREHOUSE at a folder this user can write")
    assert blocker.read_text() == "x"
