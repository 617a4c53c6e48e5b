"""The storage layer's checkpoints are written after the commit, by a background thread
(storage/rows/commit.py, `checkpoint_later`): the commit returns before its checkpoint,
the checkpoint lands at the version that was due, delta-rs and the layer's own replay read
every version across it, and a checkpoint that fails costs the commit nothing. No Spark.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from backfill_assets.storage import Intent, KeyedRows, TableVersion, apply_keyed, ensure_mor_table
from backfill_assets.storage.delta.log import read_checkpoint
from backfill_assets.storage.rows import commit
from backfill_assets.storage.store.lru import clear_all

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("vnode", pa.int32())])


def _rows(values: dict[str, int]) -> pa.Table:
    keys = sorted(values)
    return pa.table({"k": keys, "n": [values[k] for k in keys], "vnode": [0] * len(keys)},
                    schema=SCHEMA)


def _barriers(uri: str, count: int) -> tuple[dict[str, int], dict[int, list[tuple]]]:
    """``count`` keyed commits, each changing one key and adding one: the rows after them,
    and each commit's version -> its rows."""
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "1"})
    rows: dict[str, int] = {}
    versions = {}
    for step in range(count):
        before = {k: rows[k] for k in list(rows)[:1]}
        after = {**{k: v + 1 for k, v in before.items()}, f"k{step}": step}
        applied = apply_keyed(TableVersion.load(uri), ["k"], Intent({"t/mv/0": step}),
                              KeyedRows(_rows(before), _rows(after)))
        rows.update(after)
        versions[applied.version] = sorted(rows.items())
    return rows, versions


def _scan(uri: str, version: int | None = None) -> list[tuple]:
    return sorted((r["k"], r["n"]) for r in
                  pa.table(DeltaTable(uri, version=version).scan()).to_pylist())


def test_the_commit_returns_before_its_checkpoint_and_every_reader_reads_across_it(
        tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "CHECKPOINT_INTERVAL", 3)
    release = threading.Event()
    real = commit._write_checkpoint

    def held_back(*args):
        release.wait(30)
        real(*args)

    monkeypatch.setattr(commit, "_write_checkpoint", held_back)
    uri = str(tmp_path / "t")
    rows, versions = _barriers(uri, 7)  # the versions that are multiples of 3 are due
    last = max(versions)
    assert read_checkpoint(uri, last, {}, ("add",))[0] == -1  # none written yet: held back
    release.set()
    commit.settle_checkpoints()
    assert read_checkpoint(uri, last, {}, ("add",))[0] == last - last % 3
    clear_all()  # the layer's replay from the checkpoint, not from its cache
    snap = TableVersion.load(uri)
    assert snap.txn_versions["t/mv/0"] == 6
    assert snap.live_rows == len(rows)
    assert _scan(uri) == sorted(rows.items())
    for version, expected in versions.items():  # before, at and between the checkpoints
        assert _scan(uri, version) == expected


def test_a_failed_checkpoint_fails_no_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "CHECKPOINT_INTERVAL", 2)

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(commit, "_write_checkpoint", broken)
    uri = str(tmp_path / "t")
    rows, _ = _barriers(uri, 4)
    assert _scan(uri) == sorted(rows.items())
    with pytest.raises(OSError, match="disk full"):
        commit.settle_checkpoints()
    commit.settle_checkpoints()  # reported once
