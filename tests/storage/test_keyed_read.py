"""``rows_of_keys`` returns exactly the live rows of the keys asked, whatever opens fewer row
groups: property-based against an independent model of what the table holds (and the
table's own full read), over key types, repeated, absent and null keys, deletion vectors
and updates from the platform's keyed commits, files from delta-rs with large unsorted row
groups, and an object store. No Spark here.
"""

from __future__ import annotations

import datetime as dt
import decimal
import pathlib
import random
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.storage import (
    ROW_GROUP_ROWS_PROPERTY,
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    ensure_mor_table,
    file_reader,
    rows_of_keys,
)
from backfill_assets.storage.rows.keyed_read import row_groups_read

VNODES = 4

# each kind: key fields, and key values from a row id (distinct ids give distinct keys)
KINDS = {
    "int": ([("k0", pa.int64())], lambda i: ((i * 7919) % 10007 - 5000,)),
    "string": ([("k0", pa.string())], lambda i: (f"k{(i * 37) % 1009:04d}",)),
    "decimal": ([("k0", pa.decimal128(10, 2))],
                lambda i: (decimal.Decimal(i * 3 - 200) / 100,)),
    "date": ([("k0", pa.date32())],
             lambda i: (dt.date(2000, 1, 1) + dt.timedelta(days=(i * 13) % 997),)),
    "multi": ([("k0", pa.int32()), ("k1", pa.string())], lambda i: (i % 17, f"s{i // 17:03d}")),
}


def _schema(kind: str) -> pa.Schema:
    return pa.schema([*KINDS[kind][0], ("v", pa.string()), ("vnode", pa.int32())])


def _key_names(kind: str) -> list[str]:
    return [name for name, _ in KINDS[kind][0]]


def _row(kind: str, i: int, value: str) -> dict:
    key = dict(zip(_key_names(kind), KINDS[kind][1](i), strict=True))
    return {**key, "v": value, "vnode": i % VNODES}


def _rows(kind: str, ids, value=lambda i: f"v{i}") -> pa.Table:
    return pa.Table.from_pylist([_row(kind, i, value(i)) for i in ids], schema=_schema(kind))


def _keys(kind: str, ids, nulls: int, with_vnode: bool) -> pa.Table:
    """The keys of ``ids`` (in their order, repeats kept) and ``nulls`` keys holding a null."""
    names = _key_names(kind)
    rows = [{k: v for k, v in _row(kind, i, "").items() if k in names or k == "vnode"}
            for i in ids]
    for n in range(nulls):
        row = {k: v for k, v in _row(kind, n, "").items() if k in names or k == "vnode"}
        row[names[n % len(names)]] = None
        rows.append(row)
    fields = [f for f in _schema(kind) if f.name in names or (with_vnode and f.name == "vnode")]
    return pa.Table.from_pylist([{f.name: r[f.name] for f in fields} for r in rows],
                                schema=pa.schema(fields))


def _sorted(rows: list[dict], names: list[str]) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in [*names, "v"]))


def _platform_table(uri: str, kind: str, ids: list[int], deleted: set[int],
                    updated: set[int], group_rows: int, file_rows: int,
                    storage_options: dict | None = None) -> dict[int, dict]:
    """A merge-on-read table written by the platform's keyed commits (inserts, then
    deletes and updates: deletion vectors), and the model of what it holds."""
    config = {"backfill.vnodeCount": str(VNODES), ROW_GROUP_ROWS_PROPERTY: str(group_rows)}
    ensure_mor_table(uri, _schema(kind), storage_options, cdf=True, configuration=config)
    names = _key_names(kind)
    first = _rows(kind, ids)
    apply_keyed(TableVersion.load(uri, None, storage_options), names, Intent({"t/x/0": 0}),
                KeyedRows(first.slice(0, 0), first), file_rows=file_rows)
    changed = sorted(deleted | updated)
    if changed:
        after = _rows(kind, sorted(updated - deleted), lambda i: f"new{i}")
        apply_keyed(TableVersion.load(uri, None, storage_options), names,
                    Intent({"t/x/0": 1}), KeyedRows(_rows(kind, changed), after))
    return {i: _row(kind, i, f"new{i}" if i in updated else f"v{i}")
            for i in ids if i not in deleted}


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rows_of_keys_equal_a_full_read_filtered(kind, data):
    ids = sorted(data.draw(st.sets(st.integers(0, 300), min_size=1, max_size=120), label="ids"))
    deleted = data.draw(st.sets(st.sampled_from(ids), max_size=20), label="deleted") \
        if ids else set()
    updated = data.draw(st.sets(st.sampled_from(ids), max_size=20), label="updated") \
        if ids else set()
    held_asked = data.draw(st.lists(st.sampled_from(ids), max_size=40), label="held_asked") \
        if ids else []
    asked = held_asked + data.draw(st.lists(st.integers(0, 400), max_size=20), label="asked")
    nulls = data.draw(st.integers(0, 3), label="nulls")
    with_vnode = data.draw(st.booleans(), label="with_vnode")
    group_rows = data.draw(st.sampled_from([1, 3, 8, 1000]), label="group_rows")
    file_rows = data.draw(st.sampled_from([7, 40, 1000]), label="file_rows")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/t"
        held = _platform_table(uri, kind, ids, deleted, updated, group_rows, file_rows)
        snap = TableVersion.load(uri)
        names = _key_names(kind)
        expected = [held[i] for i in sorted(set(asked)) if i in held]
        full = pa.table(DeltaTable(uri).scan())  # delta-rs' own read, DVs applied
        assert _sorted(full.to_pylist(), names) == _sorted(list(held.values()), names)
        got = rows_of_keys(snap, names, _keys(kind, asked, nulls, with_vnode))
        assert got.schema == _schema(kind)
        assert _sorted(got.to_pylist(), names) == _sorted(expected, names)


def test_a_few_keys_open_a_few_row_groups(tmp_path):
    """Files sorted by (vnode, key) in groups of 10 rows: three keys with their vnodes open
    about one group each, of 100; without vnodes, each key's group in every vnode."""
    uri = str(tmp_path / "t")
    _platform_table(uri, "int", list(range(1000)), set(), set(), 10, 250)
    snap = TableVersion.load(uri)
    groups = sum(pq.ParquetFile(snap.file_uri(f.path)).metadata.num_row_groups
                 for f in snap.files)
    assert groups >= 100
    keys = _keys("int", [5, 500, 901], 0, True)
    opened = sum(len(g) for g in row_groups_read(snap, ["k0"], keys).values())
    assert 1 <= opened <= 6
    assert rows_of_keys(snap, ["k0"], keys).num_rows == 3


def test_key_columns_may_be_a_prefix_of_the_table_key(tmp_path):
    """The join index is read by its join key: every row holding it comes back."""
    uri = str(tmp_path / "t")
    _platform_table(uri, "multi", list(range(200)), {17}, set(), 8, 50)
    snap = TableVersion.load(uri)
    got = rows_of_keys(snap, ["k0"], pa.table({"k0": pa.array([0, 3, None], pa.int32())}))
    expected = [_row("multi", i, f"v{i}") for i in range(200) if i % 17 in (0, 3) and i != 17]
    assert _sorted(got.to_pylist(), ["k0", "k1"]) == _sorted(expected, ["k0", "k1"])


@pytest.mark.parametrize("with_vnode", [True, False])
def test_files_of_another_writer_read_correctly(tmp_path, with_vnode):
    """delta-rs' files: vnode partitions, rows in no order, one large row group each."""
    uri = str(tmp_path / "t")
    ids = list(range(1000))  # distinct string keys below 1009
    random.Random(7).shuffle(ids)
    write_deltalake(uri, _rows("string", ids), partition_by=["vnode"])
    ids.sort()
    DeltaTable(uri).delete("v = 'v10' OR v = 'v11'")
    snap = TableVersion.load(uri)
    asked = [10, 11, 12, 13, 999, 1005, 12]
    got = rows_of_keys(snap, ["k0"], _keys("string", asked, 1, with_vnode), ["k0", "vnode"])
    assert got.schema == pa.schema([("k0", pa.string()), ("vnode", pa.int32())])
    assert sorted(got.to_pylist(), key=lambda r: r["k0"]) == sorted(
        [{"k0": _row("string", i, "")["k0"], "vnode": i % VNODES} for i in (12, 13, 999)],
        key=lambda r: r["k0"])


def test_nothing_asked_reads_nothing(tmp_path):
    uri = str(tmp_path / "t")
    _platform_table(uri, "int", list(range(10)), set(), set(), 3, 5)
    snap = TableVersion.load(uri)
    empty = _keys("int", [], 0, True)
    assert rows_of_keys(snap, ["k0"], empty).num_rows == 0
    assert rows_of_keys(snap, ["k0"], _keys("int", [], 2, False), ["v"]).schema.names == ["v"]


def test_an_object_store_table_reads_the_same(s3_server):
    uri = s3_server.fresh_uri("keyed_read")
    so = dict(s3_server.storage_options)
    held = _platform_table(uri, "multi", list(range(150)), {3, 40}, {4, 41}, 4, 60, so)
    snap = TableVersion.load(uri, None, so)
    asked = [3, 4, 5, 40, 41, 149, 999]
    got = rows_of_keys(snap, ["k0", "k1"], _keys("multi", asked, 1, True))
    expected = [held[i] for i in asked if i in held]
    assert _sorted(got.to_pylist(), ["k0", "k1"]) == _sorted(expected, ["k0", "k1"])


def test_a_file_read_again_after_a_new_dv_reads_its_new_dv(tmp_path):
    """Footers are cached by file; the DV comes from the version read: a later delete is
    seen, and the earlier version still holds the row."""
    uri = str(tmp_path / "t")
    _platform_table(uri, "int", list(range(100)), set(), set(), 4, 100)
    keys = _keys("int", [5, 6], 0, True)
    first = TableVersion.load(uri)
    assert rows_of_keys(first, ["k0"], keys).num_rows == 2
    gone = _rows("int", [5])
    apply_keyed(TableVersion.load(uri), ["k0"], Intent({"t/x/0": 1}),
                KeyedRows(gone, gone.slice(0, 0)))
    assert rows_of_keys(TableVersion.load(uri), ["k0"], keys, ["v"]).to_pylist() == [
        {"v": "v6"}]
    assert rows_of_keys(TableVersion.load(uri, first.version), ["k0"], keys).num_rows == 2


def test_the_spark_write_path_writes_the_tables_row_groups(spark, tmp_path):
    """The bulk commit (``apply_changes``, what the join state's bulk build uses) writes
    files sorted by (vnode, key) in row groups of the table's ``backfill.rowGroupRows``."""
    from backfill_assets.storage import apply_changes

    uri = str(tmp_path / "t")
    config = {"backfill.vnodeCount": str(VNODES), ROW_GROUP_ROWS_PROPERTY: "16"}
    ensure_mor_table(uri, _schema("int"), None, cdf=True, configuration=config)
    rows = _rows("int", range(300))
    apply_changes(spark, TableVersion.load(uri), ["k0"], Intent({"t/x/0": 0}),
                  inserts=spark.createDataFrame(rows.to_pandas()), rows_hint=300)
    snap = TableVersion.load(uri)
    for f in snap.files:
        md = pq.ParquetFile(snap.file_uri(f.path)).metadata
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        assert max(sizes) <= 16 and all(s == 16 for s in sizes[:-1])
        held = pq.read_table(snap.file_uri(f.path), columns=["vnode", "k0"]).to_pylist()
        assert held == sorted(held, key=lambda r: (r["vnode"], r["k0"]))
    asked = [0, 1, 150, 299, 7000]
    got = rows_of_keys(snap, ["k0"], _keys("int", asked, 0, True))
    assert _sorted(got.to_pylist(), ["k0"]) == _sorted(
        [_row("int", i, f"v{i}") for i in asked if i < 300], ["k0"])


KERNEL = pathlib.Path(__file__).resolve().parents[1] / "data" / "kernel"


@pytest.mark.parametrize(("table", "key"), [
    ("table-with-dv-small", "value"), ("with-short-dv", "id"),
    ("cdf-column-mapping-name-mode", "id"), ("cdf-column-mapping-id-mode", "name"),
    ("cdf-table-with-cdc-and-dvs", "id"), ("data-reader-timestamp_ntz", "id"),
    ("data-reader-timestamp_ntz", "tsNtzPartition")])
def test_tables_written_by_databricks_read_as_the_layers_full_read(table, key):
    """Databricks' DVs, column mapping (physical names in the footers) and partition values:
    every other value of the key asked, plus one no row holds."""
    snap = TableVersion.load(str(KERNEL / table))
    read = file_reader(snap, snap.arrow_schema.names)
    full = pa.concat_tables([read(f) for f in snap.files]).to_pylist()
    values = sorted({r[key] for r in full if r[key] is not None})
    asked = values[::2]
    past = values[-1] + (dt.timedelta(days=1) if isinstance(values[-1], dt.datetime)
                         else "~" if isinstance(values[-1], str) else 1)
    keys = pa.table({key: pa.array([*asked, past, None], snap.arrow_schema.field(key).type)})
    got = rows_of_keys(snap, [key], keys)
    assert got.schema == snap.arrow_schema
    order = lambda r: tuple(str(v) for v in r.values())  # noqa: E731
    assert sorted(got.to_pylist(), key=order) == sorted(
        [r for r in full if r[key] in asked], key=order)
