"""Copy-on-write commits: which files a keyed change can touch, and the Spark merge that
rewrites only those (spark_delta_writer.merge_dataframe), checked against a plain recomputation."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from backfill_assets import mv_store
from backfill_assets.spark_delta_writer import merge_dataframe

UTC = dt.timezone.utc


def _table(path: str, batches: list[pa.Table]) -> DeltaTable:
    """One file per batch (and vnode), so each file has a known key range."""
    for batch in batches:
        write_deltalake(path, batch, partition_by=["vnode"], mode="append")
    return DeltaTable(path)


def _rows(ids: list[int], vnode: int, **extra) -> pa.Table:
    cols = {"id": pa.array(ids, pa.int64()), "vnode": pa.array([vnode] * len(ids), pa.int32())}
    cols.update({k: pa.array(v) for k, v in extra.items()})
    return pa.table(cols)


def _paths(files: list[dict]) -> list[str]:
    return sorted(f["path"] for f in files)


def test_only_files_whose_range_admits_a_key_are_touched(tmp_path) -> None:
    t = _table(str(tmp_path / "t"), [_rows([1, 2, 3], 0), _rows([10, 11, 12], 0),
                                     _rows([2, 3, 4], 1)])
    by_range = {(f["partition.vnode"], f["min.id"]): f["path"]
                for f in pa.table(t.get_add_actions(flatten=True)).to_pylist()}
    keys = _rows([11, 5], 0)  # 11 sits in the second file of vnode 0; 5 in no file's range
    touched = mv_store.files_holding(t, keys, ["id"])
    assert _paths(touched) == [by_range[(0, 10)]]
    assert {f["vnode"] for f in touched} == {0}
    # vnode 1's file holds ids 2..4, but a key of vnode 0 never touches another vnode
    assert mv_store.files_holding(t, _rows([3], 0), ["id"])[0]["path"] == by_range[(0, 1)]
    assert mv_store.files_holding(t, _rows([], 0), ["id"]) == []


def test_inexact_stats_never_prune(tmp_path) -> None:
    """Timestamp stats are millisecond-truncated and long strings may be prefixes: those
    columns keep every file of the key's vnode."""
    ts = [dt.datetime(2026, 1, 1, 0, 0, 0, us, tzinfo=UTC) for us in (100, 200)]
    t = _table(str(tmp_path / "ts"), [
        pa.table({"ts": pa.array(ts, pa.timestamp("us", "UTC")),
                  "vnode": pa.array([0, 0], pa.int32())}),
        pa.table({"ts": pa.array([ts[0] + dt.timedelta(days=9)], pa.timestamp("us", "UTC")),
                  "vnode": pa.array([0], pa.int32())}),
    ])
    probe = pa.table({"vnode": pa.array([0], pa.int32()),
                      "ts": pa.array([ts[1] + dt.timedelta(microseconds=300)],
                                     pa.timestamp("us", "UTC"))})
    assert len(mv_store.files_holding(t, probe, ["ts"])) == 2
    long = "x" * 40
    s = _table(str(tmp_path / "s"), [_rows([1], 0, name=[long + "a"]),
                                     _rows([2], 0, name=["b"])])
    hits = mv_store.files_holding(s, pa.table({"vnode": pa.array([0], pa.int32()),
                                               "name": [long + "z"]}), ["name"])
    assert len(hits) == 1  # "b" file excluded by its exact stats; the long-string one is kept


def test_merge_rewrites_only_touched_files_and_matches_a_recomputation(spark, tmp_path) -> None:
    path = str(tmp_path / "mv")
    t = _table(path, [_rows([1, 2, 3], 0, v=["a", "b", "c"]),
                      _rows([10, 11, 12], 0, v=["j", "k", "l"]),
                      _rows([20, 21], 1, v=["t", "u"])])
    before = set(pa.table(t.get_add_actions(flatten=True))["path"].to_pylist())
    changes = spark.createDataFrame(pa.table({
        "id": pa.array([2, 11, 5, 21], pa.int64()),
        "vnode": pa.array([0, 0, 0, 1], pa.int32()),
        "v": ["B", None, "e", None],
        "_op": ["upsert", "delete", "upsert", "delete"],
    }))
    inserts = spark.createDataFrame(_rows([30, 31], 1, v=["x", "y"]))
    props = mv_store.commit_properties("m", "mv", [0, 1], 7)
    merge_dataframe(changes, t, ["id"], props, inserts=inserts)
    t = DeltaTable(path)
    got = sorted(pa.table(t.to_pyarrow_table()).select(["id", "v", "vnode"]).to_pylist(),
                 key=lambda r: r["id"])
    expected = {1: "a", 2: "B", 3: "c", 5: "e", 10: "j", 12: "l", 20: "t", 30: "x", 31: "y"}
    assert [(r["id"], r["v"]) for r in got] == sorted(expected.items())
    after = set(pa.table(t.get_add_actions(flatten=True))["path"].to_pylist())
    # all three files held a changed key, so none survives; the app transaction is recorded
    assert not (before & after)
    assert t.transaction_version(mv_store.txn_id("m", "mv", 0)) == 7


def test_merge_keeps_files_no_change_can_touch(spark, tmp_path) -> None:
    path = str(tmp_path / "keep")
    t = _table(path, [_rows([1, 2], 0, v=["a", "b"]), _rows([50, 60], 0, v=["x", "y"])])
    files = {f["min.id"]: f["path"] for f in pa.table(t.get_add_actions(flatten=True)).to_pylist()}
    changes = spark.createDataFrame(pa.table({
        "id": pa.array([55], pa.int64()), "vnode": pa.array([0], pa.int32()),
        "v": ["new"], "_op": ["upsert"]}))
    merge_dataframe(changes, t, ["id"], mv_store.commit_properties("m", "mv", [0], 1))
    t = DeltaTable(path)
    after = set(pa.table(t.get_add_actions(flatten=True))["path"].to_pylist())
    assert files[1] in after and files[50] not in after
    assert sorted(t.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 50, 55, 60]


@pytest.mark.parametrize("op", ["delete", "upsert"])
def test_merge_of_a_key_in_no_file_range(spark, tmp_path, op) -> None:
    path = str(tmp_path / op)
    t = _table(path, [_rows([1, 2], 0, v=["a", "b"])])
    changes = spark.createDataFrame(pa.table({
        "id": pa.array([9], pa.int64()), "vnode": pa.array([0], pa.int32()),
        "v": ["n"], "_op": [op]}))
    merge_dataframe(changes, t, ["id"], mv_store.commit_properties("m", "mv", [0], 1))
    ids = sorted(DeltaTable(path).to_pyarrow_table()["id"].to_pylist())
    assert ids == ([1, 2, 9] if op == "upsert" else [1, 2])


def test_repeated_merges_keep_each_vnode_in_few_key_sorted_files(spark, tmp_path,
                                                                 monkeypatch) -> None:
    """Merges re-cluster what they rewrite: a vnode keeps about one file per
    CLUSTERED_FILE_ROWS rows however many merges ran (files used to multiply by Spark task on
    every merge, so each barrier had more files to rewrite)."""
    from backfill_assets import spark_delta_writer

    monkeypatch.setattr(spark_delta_writer, "CLUSTERED_FILE_ROWS", 50)
    path = str(tmp_path / "many")
    expected = {i: "base" for i in range(0, 400, 2)}
    t = _table(path, [_rows(list(range(v, 400, 4)), 0, v=["base"] * 100) for v in (0, 2)])
    rng = random.Random(5)
    for step in range(4):
        ids = rng.sample(range(400), 60)
        ops = [rng.choice(["upsert", "delete"]) for _ in ids]
        changes = spark.createDataFrame(pa.table({
            "id": pa.array(ids, pa.int64()), "vnode": pa.array([0] * 60, pa.int32()),
            "v": [f"s{step}"] * 60, "_op": ops})).repartition(4)  # several writer tasks
        merge_dataframe(changes, t, ["id"], mv_store.commit_properties("m", "mv", [0], step))
        for i, op in zip(ids, ops, strict=True):
            if op == "upsert":
                expected[i] = f"s{step}"
            else:
                expected.pop(i, None)
        t = DeltaTable(path)
        got = t.to_pyarrow_table()
        assert dict(zip(got["id"].to_pylist(), got["v"].to_pylist(), strict=True)) == expected
        files = pa.table(t.get_add_actions(flatten=True)).to_pylist()
        assert all(f["num_records"] <= 50 for f in files)
        for f in files:  # each file holds its rows in key order
            ids = pq.read_table(f"{path}/{f['path']}", columns=["id"])["id"].to_pylist()
            assert ids == sorted(ids)
        assert len(files) <= -(-len(expected) // 50) + 2  # a file per 50 rows, two part-filled
