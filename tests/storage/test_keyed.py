"""The driver engine of merge-on-read (``apply_keyed``) refuses a table that disagrees with the
change feed it is given, and writes nothing: a row is never lost or invented silently.

No Spark here: a small barrier's commit runs on the driver alone.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    ensure_mor_table,
    key_counts,
)

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("name", pa.string()),
                    ("vnode", pa.int32())])
KEY = ["id", "day"]


def _rows(*rows: tuple) -> pa.Table:
    import datetime as dt

    return pa.Table.from_pylist(
        [{"id": i, "day": dt.date(2024, 1, 1 + i % 3), "name": n, "vnode": i % 4}
         for i, n in rows], schema=SCHEMA)


@pytest.fixture
def table(tmp_path) -> str:
    uri = str(tmp_path / "mv")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    seed = _rows(*[(i, "seed") for i in range(20)])
    apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 0}),
                KeyedRows(seed.slice(0, 0), seed), file_rows=6)
    return uri


def _version(uri: str) -> int:
    return DeltaTable(uri).version()


def test_a_key_the_feed_says_is_held_but_is_not_stops_the_barrier(table):
    before = _version(table)
    rows = KeyedRows(_rows((3, "seed"), (99, "ghost")), _rows((3, "new")))
    with pytest.raises(StorageMismatch, match=r"does not hold the row .*id=99"):
        apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 1}), rows)
    assert _version(table) == before


def test_an_insert_of_a_key_already_held_stops_the_barrier(table):
    before = _version(table)
    rows = KeyedRows(_rows(), _rows((5, "dup")))
    with pytest.raises(StorageMismatch, match=r"already holds a row .*id=5"):
        apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 1}), rows)
    assert _version(table) == before


def test_updates_deletes_and_noops_commit_exactly(table):
    rows = KeyedRows(_rows((1, "seed"), (2, "seed"), (4, "seed")),
                     _rows((1, "one"), (4, "seed"), (30, "fresh")))
    done = apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 1}), rows)
    assert (done.rows_written, done.rows_deleted) == (2, 2)  # 4 is unchanged
    feed = pa.table(DeltaTable(table).load_cdf(starting_version=done.version,
                                               ending_version=done.version))
    got = sorted((r["id"], r["name"], r["_change_type"]) for r in feed.to_pylist())
    assert got == [(1, "one", "update_postimage"), (1, "seed", "update_preimage"),
                   (2, "seed", "delete"), (30, "fresh", "insert")]
    counts = key_counts(TableVersion.load(table), _rows((1, ""), (2, ""), (30, "")), KEY)
    assert sorted(counts.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "day": _rows((1, ""))["day"][0].as_py(), "count": 1},
        {"id": 30, "day": _rows((30, ""))["day"][0].as_py(), "count": 1}]
