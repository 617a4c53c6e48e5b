"""Merge-on-read commits against a plain Python model of the table.

Random batches of upserts, deletes, no-op upserts and inserts are applied with
``storage.apply_changes`` (Spark merge, or keyed rows found on the driver beside Spark-written
inserts: a chunked barrier's commit) or ``storage.apply_keyed`` to a small table (tiny files,
so keys spread over many files and DVs stack up; frequent checkpoints, so the log replay
crosses them). After every commit the table read by delta-rs ``QueryBuilder``, polars
``read_delta`` and the layer's Spark reader equals the model, and ``load_cdf`` of the commit
equals the changes it made (exact pre/post images).
"""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.names import OP
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    TableVersion,
    apply_changes,
    apply_keyed,
    ensure_mor_table,
)
from backfill_assets.storage.rows import commit
from backfill_assets.storage.rows.scan import read_table_version
from backfill_assets.storage.writes import maintain
from backfill_assets.storage.writes.maintain import collect_dv_garbage, compact

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("vnode", pa.int32())])
SPARK_SCHEMA = "id long, name string, vnode int"
KEYS = st.integers(0, 30)
OPS = st.lists(st.tuples(KEYS, st.sampled_from(["upsert", "delete", "same"]),
                         st.sampled_from(["a", "b", "ü"])), max_size=12)
BATCHES = st.lists(st.tuples(OPS, st.lists(st.integers(100, 130), max_size=6, unique=True)),
                   min_size=2, max_size=4)


def _rows(table) -> Counter:
    return Counter(json.dumps(r, sort_keys=True) for r in table.to_pylist())


def _model_rows(model: dict) -> Counter:
    return Counter(json.dumps({"id": k, "name": v, "vnode": k % 4}, sort_keys=True)
                   for k, v in model.items())


def _apply(spark, uri, model, ops, fresh, step, file_rows, engine):
    """One commit through ``engine`` (Spark ``apply_changes``, the driver's ``apply_keyed``,
    or ``combined``: the changes as keyed rows, the inserts as a Spark frame clustered by
    (vnode, key) like a seek chunk, in one ``apply_changes``); returns what it committed and
    the change rows it must report."""
    changes, expected, seen, before = [], [], set(), []
    for key, op, name in ops:
        if key in seen:
            continue  # netted changes: one row per key
        seen.add(key)
        old = model.get(key)
        if op == "same":
            if old is None:
                continue
            op, name = "upsert", old
        changes.append((key, name if op == "upsert" else None, key % 4, op))
        if old is not None:
            before.append((key, old, key % 4))
        if op == "upsert" and old is None:
            expected.append((key, name, "insert"))
        elif op == "upsert" and old != name:
            expected += [(key, old, "update_preimage"), (key, name, "update_postimage")]
        elif op == "delete" and old is not None:
            expected.append((key, old, "delete"))
        if op == "upsert":
            model[key] = name
        else:
            model.pop(key, None)
    inserts = [k for k in fresh if k not in model]
    for k in inserts:
        model[k] = "new"
        expected.append((k, "new", "insert"))
    intent = Intent({"t/mv/0": step})
    if engine == "driver":
        after = [(k, n, v) for k, n, v, op in changes if op == "upsert"]
        after += [(k, "new", k % 4) for k in inserts]
        rows = KeyedRows(_arrow(before), _arrow(after))
        return apply_keyed(TableVersion.load(uri), ["id"], intent, rows,
                           file_rows=file_rows), expected
    ins = spark.createDataFrame([(k, "new", k % 4) for k in inserts], SPARK_SCHEMA) \
        if inserts else None
    if engine == "combined":
        after = [(k, n, v) for k, n, v, op in changes if op == "upsert"]
        chunk = ins.coalesce(1).sortWithinPartitions("vnode", "id") if ins else None
        return apply_keyed(TableVersion.load(uri), ["id"], intent,
                           KeyedRows(_arrow(before), _arrow(after)), inserts=chunk,
                           rows_hint=len(inserts), file_rows=file_rows,
                           clustered_inserts=True), expected
    ch = spark.createDataFrame(changes, SPARK_SCHEMA + f", {OP} string") if changes else None
    applied = apply_changes(spark, TableVersion.load(uri), ["id"], intent,
                            changes=ch, inserts=ins, rows_hint=len(changes) + len(inserts),
                            file_rows=file_rows)
    return applied, expected


def _arrow(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows],
                                schema=SCHEMA)


@pytest.mark.spark
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=BATCHES, file_rows=st.sampled_from([3, 7]),
       engine=st.sampled_from(["spark", "driver", "combined"]))
def test_commits_equal_the_model_for_every_reader(spark, tmp_path_factory, monkeypatch,
                                                  batches, file_rows, engine):
    """Every engine of a merge-on-read commit (Spark for big barriers, the driver for small
    ones, keyed rows + Spark inserts for chunked ones) against the same model; the final
    compaction on the same engine (a compaction of more than DRIVER_COMPACT_ROWS rows runs in
    Spark)."""
    monkeypatch.setattr(commit, "CHECKPOINT_INTERVAL", 3)
    monkeypatch.setattr(maintain, "DRIVER_COMPACT_ROWS",
                        0 if engine == "spark" else maintain.DRIVER_COMPACT_ROWS_DEFAULT)
    uri = str(tmp_path_factory.mktemp("mor") / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    model = {k: "seed" for k in range(0, 30, 2)}
    seed = spark.createDataFrame([(k, "seed", k % 4) for k in model], SPARK_SCHEMA)
    apply_changes(spark, TableVersion.load(uri), ["id"], Intent({"t/mv/0": 0}), inserts=seed,
                  rows_hint=len(model), file_rows=file_rows)
    for step, (ops, fresh) in enumerate(batches, start=1):
        applied, expected = _apply(spark, uri, model, ops, fresh, step, file_rows, engine)
        commit.settle_checkpoints()  # written in the background: the reads below cross them
        dt = DeltaTable(uri)
        assert dt.transaction_version("t/mv/0") == step
        query = QueryBuilder().register("t", dt).execute("select * from t").read_all()
        assert _rows(pa.table(query)) == _model_rows(model)
        assert _rows(pl.read_delta(uri).to_arrow()) == _model_rows(model)
        read = read_table_version(spark, TableVersion.load(uri))
        assert _rows(read.toArrow()) == _model_rows(model)
        feed = pa.table(dt.load_cdf(starting_version=applied.version,
                                    ending_version=applied.version))
        got = Counter((r["id"], r["name"], r["_change_type"]) for r in feed.to_pylist())
        assert got == Counter(expected), f"change feed of commit {step}"
    compact(spark, TableVersion.load(uri), ["id"], force=True)
    snap = TableVersion.load(uri)
    assert not any(f.deletion_vector for f in snap.files)
    assert _rows(read_table_version(spark, snap).toArrow()) == _model_rows(model)
    collect_dv_garbage(snap, keep_versions=0, min_age_seconds=0)
    assert _rows(pl.read_delta(uri).to_arrow()) == _model_rows(model)


@pytest.mark.spark
def test_two_writers_sharing_a_file_are_rebased_and_a_same_vnode_race_is_fenced(spark, tmp_path):
    from backfill_assets.core.errors import ConcurrentBackfillRun

    uri = str(tmp_path / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=True)
    rows = spark.createDataFrame([(k, "x", k % 4) for k in range(8)], SPARK_SCHEMA)
    apply_changes(spark, TableVersion.load(uri), ["id"], Intent(), inserts=rows, rows_hint=8)
    planned = TableVersion.load(uri)  # both writers plan on this version: one file, vnodes 0..3
    assert len(planned.files) == 1

    def delete(key: int, app: str):
        ch = spark.createDataFrame([(key, None, key % 4, "delete")],
                                   SPARK_SCHEMA + f", {OP} string")
        return apply_changes(spark, planned, ["id"], Intent({app: 1}), changes=ch)

    delete(1, "t/mv/1")
    delete(2, "t/mv/2")  # lost the race for the version: rebased onto the winner's DV
    assert sorted(pa.table(DeltaTable(uri).scan())["id"].to_pylist()) == [0, 3, 4, 5, 6, 7]
    with pytest.raises(ConcurrentBackfillRun, match="t/mv/1"):
        delete(5, "t/mv/1")  # the same vnode's app id moved since `planned`: fenced
    assert sorted(pa.table(DeltaTable(uri).scan())["id"].to_pylist()) == [0, 3, 4, 5, 6, 7]


@pytest.mark.spark
def test_keyed_changes_beside_spark_inserts_make_one_exact_commit(spark, tmp_path):
    """A chunked barrier's commit: forwarded changes as keyed rows (found by key lookups on
    the driver) and a snapshot chunk that Spark writes, one version, its change feed exact
    (keyed rows as pre/post images, inserts, deletes; the chunk as inserts), the hooks in the
    crash tests' order; a keyed side the table disagrees with writes nothing."""
    from backfill_assets.core.errors import StorageMismatch

    uri = str(tmp_path / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    seed = spark.createDataFrame([(k, "seed", k % 4) for k in range(20)], SPARK_SCHEMA)
    apply_changes(spark, TableVersion.load(uri), ["id"], Intent({"t/mv/0": 0}), inserts=seed,
                  rows_hint=20, file_rows=4)

    def chunk(keys):
        rows = spark.createDataFrame([(k, "chunk", k % 4) for k in keys], SPARK_SCHEMA)
        return rows.coalesce(1).sortWithinPartitions("vnode", "id")

    def commit(step, before, after, keys):
        points = []
        applied = apply_keyed(TableVersion.load(uri), ["id"], Intent({"t/mv/0": step}),
                              KeyedRows(_arrow(before), _arrow(after)),
                              inserts=chunk(keys), rows_hint=len(keys), file_rows=4,
                              clustered_inserts=True, hook=points.append)
        feed = pa.table(DeltaTable(uri).load_cdf(starting_version=applied.version,
                                                 ending_version=applied.version))
        return applied, points, Counter((r["id"], r["name"], r["_change_type"])
                                        for r in feed.to_pylist())

    # 2 updated, 4 deleted, 6 upserted as it is (no change), 31 inserted; chunk 100..104
    applied, points, got = commit(1, [(2, "seed", 2), (4, "seed", 0), (6, "seed", 2)],
                                  [(2, "x", 2), (6, "seed", 2), (31, "ins", 3)],
                                  range(100, 105))
    assert applied.version == TableVersion.load(uri).version and applied.rows_deleted == 2
    assert points == ["data_files_written", "change_files_written", "dv_file_written"]
    assert got == Counter([(2, "seed", "update_preimage"), (2, "x", "update_postimage"),
                           (4, "seed", "delete"), (31, "ins", "insert"),
                           *[(k, "chunk", "insert") for k in range(100, 105)]])
    model = {k: "seed" for k in range(20) if k != 4} | {2: "x", 31: "ins"}
    model |= {k: "chunk" for k in range(100, 105)}
    assert _rows(pl.read_delta(uri).to_arrow()) == _model_rows(model)
    # nothing deleted: no change files, the version's adds read as inserts
    applied, points, got = commit(2, [], [(40, "new", 0)], range(200, 202))
    assert points == ["data_files_written", "dv_file_written"]
    assert got == Counter([(40, "new", "insert"), (200, "chunk", "insert"),
                           (201, "chunk", "insert")])
    # the table does not hold what the feed says it holds: refused, nothing written
    files = {str(p) for p in tmp_path.rglob("*") if p.is_file()}
    version = TableVersion.load(uri).version
    with pytest.raises(StorageMismatch, match="does not hold"):
        commit(3, [(55, "seed", 3)], [(55, "y", 3)], range(300, 302))
    assert TableVersion.load(uri).version == version
    assert {str(p) for p in tmp_path.rglob("*") if p.is_file()} == files
