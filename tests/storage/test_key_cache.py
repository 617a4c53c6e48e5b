"""The key cache of small barriers (``storage.key_cache``) answers exactly what a fresh read of
the files would: a DV that grew after the keys were cached is honoured, a file compaction
removed leaves the cache, and the bound in bytes holds. No Spark: key lookups run on the
driver.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    clear_all,
    ensure_mor_table,
    key_counts,
)
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.commit import Change, commit

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("vnode", pa.int32())])
KEY = ["id"]


def _rows(*rows: tuple) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "vnode": i % 4} for i, n in rows],
                                schema=SCHEMA)


def _seeded(uri: str, file_rows: int) -> str:
    """A merge-on-read table of keys 0..39 in files of ``file_rows`` rows."""
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    seed = _rows(*[(i, "seed") for i in range(40)])
    apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 0}),
                KeyedRows(seed.slice(0, 0), seed), file_rows=file_rows)
    return uri


@pytest.fixture
def table(tmp_path) -> str:
    clear_all()
    yield _seeded(str(tmp_path / "mv"), 8)
    clear_all()


def _counts(uri: str, *ids: int) -> dict[int, int]:
    got = key_counts(TableVersion.load(uri), _rows(*[(i, "") for i in ids]), KEY).to_pylist()
    return {r["id"]: r["count"] for r in got}


def test_a_cached_file_whose_dv_grew_returns_exactly_its_live_rows(table):
    # the seed's files were written by this process: their keys were kept as they were written
    assert _counts(table, 1, 2, 3) == {1: 1, 2: 1, 3: 1}
    assert not key_cache.CACHE.misses and key_cache.CACHE.cached_paths(table)
    hits = key_cache.CACHE.hits
    # update 1, delete 2: their files get DV bits; 1 moves to a new file
    apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 1}),
                KeyedRows(_rows((1, "seed"), (2, "seed")), _rows((1, "one"))))
    assert _counts(table, 1, 2, 3) == {1: 1, 3: 1}
    assert key_cache.CACHE.hits > hits  # the seed files were not read again
    # the feed saying 2 is still held is refused; inserting 2 again is fine
    with pytest.raises(StorageMismatch, match="does not hold the row"):
        apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 2}),
                    KeyedRows(_rows((2, "seed")), _rows((2, "two"))))
    apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 2}),
                KeyedRows(_rows(), _rows((2, "two"))))
    assert _counts(table, 1, 2) == {1: 1, 2: 1}


def test_files_this_process_writes_are_kept_as_a_read_of_them_gives_them(table):
    """A small barrier's new file: its keys are kept as it is written, equal to a read."""
    from backfill_assets.storage.rows.keyed import read_keys

    before = {f.path for f in TableVersion.load(table).files}
    apply_keyed(TableVersion.load(table), KEY, Intent({"t/mv/0": 1}),
                KeyedRows(_rows((9, "seed"), (17, "seed")),
                          _rows((9, "nine"), (17, "x"), (50, "y"))))
    snap = TableVersion.load(table)
    new = [f for f in snap.files if f.path not in before]
    assert new
    for f in new:
        kept = key_cache.CACHE.kept(snap.uri, f.path, f.size, f.num_records, KEY)
        read = key_cache.FileKeys.of(read_keys(snap, f, KEY))
        assert kept is not None
        assert (kept.sorted_keys.tolist(), kept.order.tolist()) == (read.sorted_keys.tolist(),
                                                                    read.order.tolist())
    misses = key_cache.CACHE.misses
    assert _counts(table, 9, 17, 50, 51) == {9: 1, 17: 1, 50: 1}
    assert key_cache.CACHE.misses == misses  # nothing read back


def test_a_file_removed_by_compaction_leaves_the_cache(table):
    _counts(table, *range(40))
    snap = TableVersion.load(table)
    gone = snap.files[0]
    assert gone.path in key_cache.CACHE.cached_paths(table)
    commit(snap, Change(removes=[gone], data_change=False), Intent(operation="OPTIMIZE"))
    _counts(table, 1)
    assert gone.path not in key_cache.CACHE.cached_paths(table)


def test_the_cache_stays_within_its_bound_and_lookups_stay_exact(table):
    key_cache.set_limit(50)  # smaller than one file's keys: nothing is kept
    try:
        assert _counts(table, 5, 6, 77) == {5: 1, 6: 1}
        assert key_cache.CACHE.bytes <= 50 and not key_cache.CACHE.cached_paths(table)
    finally:
        key_cache.set_limit(key_cache.DEFAULT_LIMIT_BYTES)


def test_a_lookup_past_the_cache_reads_a_file_a_row_group_at_a_time(tmp_path, monkeypatch):
    """Past the cache, a file's keys are probed one row group at a time (the driver holds a
    group, not a file): the rows found are the file's rows, DVs in later groups honoured."""
    import pyarrow.parquet as pq

    from backfill_assets.storage.rows import write

    monkeypatch.setattr(write, "ROW_GROUP_ROWS", 3)
    clear_all()
    uri = _seeded(str(tmp_path / "grouped"), 16)
    snap = TableVersion.load(uri)
    assert all(pq.ParquetFile(snap.file_uri(f.path)).metadata.num_row_groups > 1
               for f in snap.files if f.num_records > 3)
    key_cache.set_limit(50)  # past the cache
    try:
        apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 1}),
                    KeyedRows(_rows((1, "seed"), (2, "seed"), (35, "seed"), (38, "seed")),
                              _rows((1, "one"), (38, "new"))))
        assert _counts(uri, 1, 2, 17, 30, 35, 38, 39, 77) == {1: 1, 17: 1, 30: 1, 38: 1, 39: 1}
        assert not key_cache.CACHE.cached_paths(uri)
    finally:
        key_cache.set_limit(key_cache.DEFAULT_LIMIT_BYTES)
        clear_all()


def test_sorted_and_joined_lookups_agree_on_duplicates():
    keys = pa.table({"id": pa.array([5, 3, 5, 9, 1], pa.int64())})
    wanted = pa.table({"id": pa.array([5, 1, 4], pa.int64())})
    fast = key_cache.FileKeys.of(keys)
    slow = key_cache.FileKeys(keys, None, None)
    assert fast.sorted_keys is not None
    for entry in (fast, slow):
        rows, found = entry.rows_of(wanted, KEY, [pa.int64()])
        assert rows.tolist() == [0, 2, 4] and found.column("id").to_pylist() == [5, 5, 1]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.none() | st.integers(-50, 50), max_size=60),
       st.lists(st.integers(-50, 50), max_size=20),
       st.sampled_from([pa.int64(), pa.int32(), pa.int16()]))
def test_a_probe_past_the_cache_finds_what_the_kept_index_finds(held, wanted, key_type):
    """A lookup that reads past the cache (``probe``: no index built) returns the same file
    rows and keys as the kept sorted index and as the hash join, duplicates and null keys in
    the file included; a narrower file type is widened to the table's."""
    keys = pa.table({"id": pa.array(held, key_type)})
    want = pa.table({"id": pa.array(sorted(set(wanted)), pa.int64())})  # keys are unique
    types = [pa.int64()]
    rows, found = key_cache.probe(keys, want, KEY, types)
    joined_rows, joined = key_cache.FileKeys(keys.cast(pa.schema([("id", pa.int64())])),
                                             None, None).rows_of(want, KEY, types)
    expected = [i for i, k in enumerate(held) if k is not None and k in set(wanted)]
    assert rows.tolist() == joined_rows.tolist() == expected
    assert found.column("id").to_pylist() == joined.column("id").to_pylist() \
        == [held[i] for i in expected]
    assert found.schema.field("id").type == pa.int64()
    if None not in held:
        indexed = key_cache.FileKeys.of(keys.cast(pa.schema([("id", pa.int64())])))
        assert indexed.rows_of(want, KEY, types)[0].tolist() == expected
