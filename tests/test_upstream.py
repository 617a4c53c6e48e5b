"""The platform upstream table: spec, creation, the DML writer (one version per batch, correct
change feed) and its rejections (named errors, nothing written)."""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import pyarrow as pa
import pytest

from backfill_assets import storage
from backfill_assets.core.errors import (
    DuplicatePrimaryKey,
    InvalidUpstreamSpec,
    MissingPrimaryKey,
    NotAnUpstreamTable,
    NullPrimaryKey,
    UnknownColumn,
    WrongColumnType,
)
from backfill_assets.core.vnode import vnode_of
from backfill_assets.upstream.writer import (
    DmlBatch,
    UpstreamSpec,
    apply_dml,
    create_upstream,
    insert_rows,
    read_upstream_spec,
    row_count,
)

UTC = dt.timezone.utc
COLUMNS = {"region": "string", "id": "bigint", "name": "string", "amount": "decimal(10,2)",
           "ts": "timestamp", "day": "date", "flag": "boolean", "score": "double", "n": "int"}


def spec(pk=("region", "id"), vnodes=16) -> UpstreamSpec:
    return UpstreamSpec(name="orders", columns=COLUMNS, primary_key=pk, vnode_count=vnodes)


def row(region: str, id_: int, name: str = "x", **kw) -> dict:
    r = {"region": region, "id": id_, "name": name, "amount": Decimal("1.25"),
         "ts": dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC), "day": dt.date(2024, 1, 1),
         "flag": True, "score": 0.5, "n": 3}
    r.update(kw)
    return r


def current(uri: str) -> dict:
    rows = storage.read_table(uri).to_pylist()
    return {(r["region"], r["id"]): r for r in rows}


def changes(uri: str, version: int) -> list[tuple]:
    t = storage.read_raw_changes(uri, version - 1, version)
    return sorted((r["_change_type"], r["region"], r["id"], r["name"]) for r in t.to_pylist())


@pytest.fixture
def table(warehouse) -> str:
    uri = os.path.join(warehouse, "orders")
    create_upstream(uri, spec())
    apply_dml(uri, DmlBatch(inserts=[row("eu", i, f"r{i}") for i in range(10)]))
    return uri


def test_spec_validation():
    with pytest.raises(InvalidUpstreamSpec, match="not a column"):
        UpstreamSpec("t", {"a": "int"}, ("b",))
    with pytest.raises(InvalidUpstreamSpec, match="primary key"):
        UpstreamSpec("t", {"a": "int"}, ())
    with pytest.raises(InvalidUpstreamSpec, match="key column must be"):
        UpstreamSpec("t", {"a": "double"}, ("a",))
    with pytest.raises(InvalidUpstreamSpec, match="type"):
        UpstreamSpec("t", {"a": "int", "b": "map<int,int>"}, ("a",))
    with pytest.raises(InvalidUpstreamSpec, match="partition column"):
        UpstreamSpec("t", {"a": "int", "vnode": "int"}, ("a",))
    with pytest.raises(InvalidUpstreamSpec, match="lower-case"):
        UpstreamSpec("t", {"A": "int"}, ("A",))
    s = UpstreamSpec("t", {"a": "int", "d": "DECIMAL(10, 2)"}, ("d", "a"), vnode_count=8)
    assert s.columns == {"a": "int", "d": "decimal(10,2)"}
    assert s.key_types == ("decimal(10,2)", "int")


def test_create_records_the_spec(warehouse):
    uri = os.path.join(warehouse, "t")
    s = UpstreamSpec("t", {"day": "date", "k": "string", "v": "double"}, ("day", "k"), 32)
    assert create_upstream(uri, s) == 0
    back = read_upstream_spec(uri)
    assert back == s
    dt_ = storage.open_table(uri)
    assert dt_.metadata().partition_columns == ["vnode"]
    assert storage.change_feed_enabled(dt_.metadata().configuration)
    schema = storage.arrow_schema(dt_)
    assert schema.names == ["day", "k", "v", "vnode"] and schema.field("vnode").type == pa.int32()
    assert not schema.field("day").nullable and schema.field("v").nullable


def test_not_an_upstream(warehouse):
    uri = os.path.join(warehouse, "plain")
    storage.create_table(uri, pa.schema([("a", pa.int64())]), cdf=True)
    with pytest.raises(NotAnUpstreamTable):
        read_upstream_spec(uri)


def test_each_op_is_one_version_with_the_right_change_feed(table):
    assert storage.latest_version(table) == 1
    assert changes(table, 1) == [("insert", "eu", i, f"r{i}") for i in range(10)]

    v = apply_dml(table, DmlBatch(inserts=[row("us", 1, "new")]))
    assert v == 2 and changes(table, 2) == [("insert", "us", 1, "new")]

    v = apply_dml(table, DmlBatch(updates=[{"region": "eu", "id": 1, "name": "upd"}]))
    assert v == 3
    assert changes(table, 3) == [("update_postimage", "eu", 1, "upd"),
                                 ("update_preimage", "eu", 1, "r1")]
    after = current(table)[("eu", 1)]
    assert after["name"] == "upd" and after["amount"] == Decimal("1.25")  # partial update

    v = apply_dml(table, DmlBatch(deletes=[("eu", 2)]))
    assert v == 4 and changes(table, 4) == [("delete", "eu", 2, "r2")]

    v = apply_dml(table, DmlBatch(upserts=[row("eu", 3, "ups"), row("apac", 9, "ins")]))
    assert v == 5
    assert changes(table, 5) == [("insert", "apac", 9, "ins"), ("update_postimage", "eu", 3, "ups"),
                                 ("update_preimage", "eu", 3, "r3")]

    # pk change: one matched update that rewrites the key (moves vnode partition)
    v = apply_dml(table, DmlBatch(pk_changes=[(("eu", 4), row("latam", 400, "moved"))]))
    assert v == 6
    assert changes(table, 6) == [("update_postimage", "latam", 400, "moved"),
                                 ("update_preimage", "eu", 4, "r4")]
    now = current(table)
    assert ("eu", 4) not in now and now[("latam", 400)]["name"] == "moved"
    assert now[("latam", 400)]["vnode"] == vnode_of(("latam", 400), ("string", "bigint"), 16)
    assert all(r["vnode"] == vnode_of(k, ("string", "bigint"), 16) for k, r in now.items())
    assert row_count(table) == len(now) == 11


def test_mixed_batch_is_exactly_one_version(table):
    v = apply_dml(table, DmlBatch(
        inserts=[row("us", 1), row("us", 2)],
        updates=[row("eu", 0, "u0", amount=None)],
        deletes=[{"region": "eu", "id": 1}],
        upserts=[row("eu", 5, "u5"), row("mea", 7)],
        pk_changes={("eu", 6): row("eu", 60, "m60"), ("eu", 7): row("us", 70, "m70")},
    ))
    assert v == 2 == storage.latest_version(table)
    hist = storage.open_table(table).history(1)[0]
    assert hist["operation"] == "MERGE"
    assert hist["backfill.dml"] == {"insert": 2, "update": 1, "delete": 1, "upsert": 2,
                                    "pk_change": 2}
    now = current(table)
    assert set(now) == ({("eu", i) for i in range(10)} - {("eu", 1), ("eu", 6), ("eu", 7)}
                        | {("us", 1), ("us", 2), ("mea", 7), ("eu", 60), ("us", 70)})
    assert now[("eu", 0)]["amount"] is None and now[("eu", 0)]["name"] == "u0"
    kinds = [c[0] for c in changes(table, 2)]
    assert kinds.count("insert") == 3 and kinds.count("delete") == 1
    assert kinds.count("update_preimage") == kinds.count("update_postimage") == 4


def test_merge_only_touches_the_needed_partitions(table):
    before = storage.open_table(table).get_add_actions(flatten=True).num_rows
    apply_dml(table, DmlBatch(updates=[{"region": "eu", "id": 0, "name": "z"}]))
    metrics = storage.open_table(table).history(1)[0]["operationMetrics"]
    assert metrics["num_target_files_removed"] == 1
    assert metrics["num_target_files_skipped_during_scan"] >= before - 1


REJECTED = [
    (DmlBatch(inserts=[{"region": "eu", "id": None}]), NullPrimaryKey),
    (DmlBatch(inserts=[{"region": "eu"}]), NullPrimaryKey),
    (DmlBatch(deletes=[("eu", None)]), NullPrimaryKey),
    (DmlBatch(pk_changes=[(("eu", 1), {"region": None, "id": 5})]), NullPrimaryKey),
    (DmlBatch(inserts=[row("us", 1), row("us", 1)]), DuplicatePrimaryKey),
    (DmlBatch(updates=[row("eu", 1)], deletes=[("eu", 1)]), DuplicatePrimaryKey),
    (DmlBatch(inserts=[row("eu", 3)]), DuplicatePrimaryKey),
    (DmlBatch(pk_changes=[(("eu", 1), row("eu", 2))]), DuplicatePrimaryKey),
    (DmlBatch(pk_changes=[(("eu", 1), row("us", 5))], inserts=[row("us", 5)]), DuplicatePrimaryKey),
    (DmlBatch(updates=[row("zz", 1)]), MissingPrimaryKey),
    (DmlBatch(deletes=[("eu", 99)]), MissingPrimaryKey),
    (DmlBatch(pk_changes=[(("eu", 99), row("us", 5))]), MissingPrimaryKey),
    (DmlBatch(inserts=[row("us", 1, colour="red")]), UnknownColumn),
    (DmlBatch(updates=[{"region": "eu", "id": 1, "vnode": 3}]), UnknownColumn),
    (DmlBatch(deletes=[{"region": "eu", "id": 1, "name": "x"}]), UnknownColumn),
    (DmlBatch(inserts=[row("us", "1")]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, n=2**31)]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, amount=Decimal("1.001"))]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, amount=1.5)]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, day=dt.datetime(2024, 1, 1))]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, ts="2024-01-01")]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, flag=1)]), WrongColumnType),
    (DmlBatch(inserts=[row("us", 1, score="x")]), WrongColumnType),
    (DmlBatch(deletes=[("eu",)]), WrongColumnType),
    # a valid change next to a bad one: the whole batch is refused
    (DmlBatch(inserts=[row("us", 1)], deletes=[("eu", 99)]), MissingPrimaryKey),
]


@pytest.mark.parametrize("batch,error", REJECTED, ids=[f"{e.__name__}-{i}" for i, (_, e) in
                                                       enumerate(REJECTED)])
def test_rejected_batches_write_nothing(table, batch, error):
    before = (storage.latest_version(table), current(table))
    files = sorted(os.listdir(os.path.join(table, "_delta_log")))
    with pytest.raises(error):
        apply_dml(table, batch)
    assert (storage.latest_version(table), current(table)) == before
    assert sorted(os.listdir(os.path.join(table, "_delta_log"))) == files


def test_single_column_keys_and_naive_timestamps(warehouse):
    uri = os.path.join(warehouse, "ts_keyed")
    s = UpstreamSpec("ts_keyed", {"ts": "timestamp", "v": "string"}, ("ts",), 8)
    create_upstream(uri, s)
    t0 = dt.datetime(1960, 5, 1, 1, 2, 3, 4)
    apply_dml(uri, DmlBatch(inserts=[{"ts": t0, "v": "a"}]))
    apply_dml(uri, DmlBatch(updates=[{"ts": t0.replace(tzinfo=UTC), "v": "b"}]))
    apply_dml(uri, DmlBatch(pk_changes=[(t0, {"ts": t0 + dt.timedelta(microseconds=1), "v": "c"})]))
    rows = storage.read_table(uri).to_pylist()
    assert [(r["ts"], r["v"]) for r in rows] == [(t0.replace(tzinfo=UTC, microsecond=5), "c")]
    with pytest.raises(DuplicatePrimaryKey):
        apply_dml(uri, DmlBatch(inserts=[{"ts": t0.replace(microsecond=5)}]))


def test_bulk_insert(table):
    v = insert_rows(table, pa.table({"region": ["x", "x"], "id": [1, 2], "n": [1, 2]}))
    assert v == 2 and row_count(table) == 12
    assert current(table)[("x", 2)]["n"] == 2 and current(table)[("x", 2)]["name"] is None
    bad = [
        (pa.table({"region": ["x"], "id": [1]}), DuplicatePrimaryKey),
        (pa.table({"region": ["y", "y"], "id": [1, 1]}), DuplicatePrimaryKey),
        (pa.table({"region": ["y"], "id": pa.array([None], pa.int64())}), NullPrimaryKey),
        (pa.table({"region": ["y"]}), NullPrimaryKey),
        (pa.table({"region": ["y"], "id": [5], "other": [1]}), UnknownColumn),
        (pa.table({"region": ["y"], "id": ["five"]}), WrongColumnType),
        (pa.table({"region": ["y"], "id": [5], "n": [2**40]}), WrongColumnType),
    ]
    for rows, error in bad:
        with pytest.raises(error):
            insert_rows(table, rows)
    assert storage.latest_version(table) == 2


def test_empty_batch_writes_nothing(table):
    assert apply_dml(table, DmlBatch()) == 1 == storage.latest_version(table)
