"""Bulk rows read, transformed and written by Python tasks alone (storage.BulkRows).

The source is a merge-on-read table whose files carry deletion vectors (so the tasks must drop
deleted rows), the transform a filter plus a computed column; the written table must hold
exactly the transform of the live rows, each file in (vnode, key) order with exact bounds,
and the tasks' report must give each vnode's live rows and last key (what the step's progress
is made of). A transform that refuses a value must leave nothing behind: no file, no commit;
a repeated pk is reported and nothing is written.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import (
    BulkRows,
    Intent,
    KeyedRows,
    TableVersion,
    TransformRefused,
    apply_changes,
    apply_keyed,
    commit_written,
    ensure_mor_table,
    write_bulk,
)
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.keyed import read_keys
from backfill_assets.storage.writes import bulk
from tests.support import BULK_TARGET, Refused, Twice

SOURCE = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int32()),
                    ("vnode", pa.int32())])
VNODES = 8
BY_ID = KeyOrder((KeyColumn("id", "bigint"),))


def _source(spark, uri: str, rows: list[dict], deleted: list[int]) -> TableVersion:
    """A merge-on-read table of ``rows`` (small files, so vnodes span several), then the keys
    ``deleted`` deleted by DVs."""
    ensure_mor_table(uri, SOURCE, None, cdf=False,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    seed = spark.createDataFrame(pa.Table.from_pylist(rows, SOURCE).to_pylist(),
                                 "id long, name string, qty int, vnode int")
    apply_changes(spark, TableVersion.load(uri), ["id"], Intent({"t/src/0": 0}), inserts=seed,
                  rows_hint=len(rows), file_rows=7)
    gone = [r for r in rows if r["id"] in set(deleted)]
    if gone:
        apply_keyed(TableVersion.load(uri), ["id"], Intent({"t/src/0": 1}),
                    KeyedRows(pa.Table.from_pylist(gone, SOURCE), SOURCE.empty_table()))
    return TableVersion.load(uri)


@pytest.fixture(params=["threads here", "spark tasks"])
def where(request, monkeypatch) -> str:
    """Where the bulk tasks run: on the tests' local master, threads of this process
    (``bulk.bulk_threads``); as a cluster would, Spark tasks."""
    if request.param == "spark tasks":
        monkeypatch.setattr(bulk, "tasks_run_here", lambda spark_: False)
    return request.param


def _target(uri: str) -> TableVersion:
    ensure_mor_table(uri, BULK_TARGET, None, cdf=True,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    return TableVersion.load(uri)


def _parquet_files(uri: str) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(uri) for f in fs
            if f.endswith(".parquet") and "_delta_log" not in d}


_ROWS = st.lists(st.tuples(st.integers(0, 200), st.sampled_from(["a", "ü", "", None]),
                           st.one_of(st.none(), st.integers(-3, 3))),
                 min_size=1, max_size=60, unique_by=lambda r: r[0])


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=_ROWS, deleted=st.lists(st.integers(0, 200), max_size=10),
       vnodes=st.sets(st.integers(0, VNODES - 1), min_size=1))
def test_bulk_rows_are_the_transform_of_the_live_rows(spark, tmp_path_factory, where, rows,
                                                      deleted, vnodes):
    base = tmp_path_factory.mktemp("bulk")
    data = [{"id": i, "name": n, "qty": q, "vnode": i % VNODES} for i, n, q in rows]
    src = _source(spark, str(base / "src"), data, deleted)
    dst = _target(str(base / "dst"))
    bulk_rows = BulkRows(src, tuple(sorted(vnodes)), tuple(SOURCE.names), Twice(), BY_ID, Refused)
    written = write_bulk(spark, bulk_rows, dst.uri, {}, dst.arrow_schema, max_rows_per_file=5)
    commit_written(dst, Intent({"t/dst/0": 5}), written)
    live = [r for r in data if r["id"] not in set(deleted) and r["vnode"] in vnodes]
    per_vnode: dict[int, list[int]] = {}
    for r in live:
        per_vnode.setdefault(r["vnode"], []).append(r["id"])
    assert dict(written.vnode_stats) == {v: (len(ids), (max(ids),), False)
                                         for v, ids in per_vnode.items()}
    expected = sorted((r["id"], r["name"], 2 * r["qty"], r["vnode"]) for r in live
                      if r["qty"] is not None and r["qty"] > 0)
    table = pa.table(QueryBuilder().register("t", DeltaTable(dst.uri)).execute(
        "select * from t").read_all())
    got = sorted((r["id"], r["name"], r["twice"], r["vnode"]) for r in table.to_pylist())
    assert got == expected
    assert table.schema.field("twice").type == pa.int64()
    for f in TableVersion.load(dst.uri).files:  # each file: (vnode, id) order, exact bounds
        part = pq.read_table(os.path.join(dst.uri, f.path))
        keys = list(zip(part.column("vnode").to_pylist(), part.column("id").to_pylist(),
                        strict=True))
        assert keys == sorted(keys)
        assert f.num_records == part.num_rows
        assert (f.stats[("min", "id")], f.stats[("max", "id")]) == (min(k for _, k in keys),
                                                                    max(k for _, k in keys))
    _check_kept_keys(TableVersion.load(dst.uri), where)


def _check_kept_keys(snap: TableVersion, where: str) -> None:
    """Tasks in threads here hand each file's keys to the key cache exactly as a read of the
    file would give them (the next lookup reads none); Spark tasks hand none (their cache is
    another process's)."""
    for f in snap.files:
        kept = key_cache.CACHE.kept(snap.uri, f.path, f.size, f.num_records, ["id"])
        if where == "spark tasks":
            assert kept is None
            continue
        read = key_cache.FileKeys.of(read_keys(snap, f, ["id"]))
        assert kept is not None
        assert kept.sorted_keys.tolist() == read.sorted_keys.tolist()
        assert kept.order.tolist() == read.order.tolist()


def test_a_refused_transform_leaves_nothing(spark, tmp_path, where):
    data = [{"id": i, "name": "refuse" if i == 33 else "a", "qty": 1, "vnode": i % VNODES}
            for i in range(60)]
    src = _source(spark, str(tmp_path / "src"), data, [])
    dst = _target(str(tmp_path / "dst"))
    before = (_parquet_files(dst.uri), dst.version)
    bulk_rows = BulkRows(src, tuple(range(VNODES)), tuple(SOURCE.names), Twice(), BY_ID, Refused)
    with pytest.raises(TransformRefused, match="'refuse' is not handled"):
        write_bulk(spark, bulk_rows, dst.uri, {}, dst.arrow_schema, max_rows_per_file=4)
    assert (_parquet_files(dst.uri), TableVersion.load(dst.uri).version) == before


def test_a_repeated_key_is_reported_and_nothing_written(spark, tmp_path):
    """A foreign writer's duplicate pk: the task flags its vnode and writes no file (the step
    then names the key, key_checks), the other tasks' vnodes are reported clean."""
    data = [{"id": i, "name": "a", "qty": 1, "vnode": i % VNODES} for i in range(40)]
    data.append({"id": 9, "name": "again", "qty": 1, "vnode": 9 % VNODES})
    src = _source(spark, str(tmp_path / "src"), data, [])
    dst = _target(str(tmp_path / "dst"))
    bulk_rows = BulkRows(src, (9 % VNODES,), tuple(SOURCE.names), Twice(), BY_ID, Refused)
    written = write_bulk(spark, bulk_rows, dst.uri, {}, dst.arrow_schema, max_rows_per_file=4)
    assert written.bad_keys and not written.files
    assert _parquet_files(dst.uri) == set()


def test_bulk_files_are_committed_alone(spark, tmp_path):
    src = _source(spark, str(tmp_path / "src"), [{"id": 1, "name": "a", "qty": 1, "vnode": 1}],
                  [])
    dst = _target(str(tmp_path / "dst"))
    bulk_rows = BulkRows(src, (1,), tuple(SOURCE.names), Twice(), BY_ID, Refused)
    written = write_bulk(spark, bulk_rows, dst.uri, {}, dst.arrow_schema, max_rows_per_file=4)
    keyed = KeyedRows(BULK_TARGET.empty_table(), BULK_TARGET.empty_table())
    with pytest.raises(ValueError, match="committed alone"):
        apply_keyed(dst, ["id"], Intent(), keyed, inserts=written)
    with pytest.raises(ValueError, match="committed alone"):
        apply_changes(spark, dst, ["id"], Intent(), inserts=written)
    written.discard()
    assert _parquet_files(dst.uri) == set()


def test_a_write_of_more_tasks_than_threads_take_runs_as_spark_tasks(spark, tmp_path,
                                                                     monkeypatch):
    """On the tests' local master a bulk write runs in threads here; one that would make more
    than ``MAX_TASKS_HERE`` thread tasks (files of their own each) keeps Spark's tasks, and
    writes the same rows."""
    data = [{"id": i, "name": "a", "qty": 1, "vnode": i % VNODES} for i in range(40)]
    src = _source(spark, str(tmp_path / "src"), data, [])
    bulk_rows = BulkRows(src, tuple(range(VNODES)), tuple(SOURCE.names), Twice(), BY_ID, Refused)
    assert bulk.planned_tasks(spark, bulk_rows)[1] is not None
    monkeypatch.setattr(bulk, "MAX_TASKS_HERE", 0)
    assert bulk.planned_tasks(spark, bulk_rows)[1] is None
    dst = _target(str(tmp_path / "dst"))
    written = write_bulk(spark, bulk_rows, dst.uri, {}, dst.arrow_schema, max_rows_per_file=4)
    assert sum(f.rows for f in written.files) == len(data)
