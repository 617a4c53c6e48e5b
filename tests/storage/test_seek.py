"""Chunk reads seek: the files a chunk needs come from the log's stats,
and the rows kept are the ones a sort of everything would keep. No Spark here: the file pick
and the in-task chunk are plain functions; tests/test_chunk_seek.py runs them on tables.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage.chunks.chunk_scan import take_chunk
from backfill_assets.storage.chunks.seek import chunk_files
from backfill_assets.storage.delta.log import DataFile

SINGLE = KeyOrder((KeyColumn("id", "bigint"),))
COMPOSITE = KeyOrder((KeyColumn("region", "string"), KeyColumn("id", "bigint",
                                                                  descending=True)))


def _file(name: str, vnodes: tuple[int, int], keys: list[tuple], order: KeyOrder,
          rows: int | None = None, deleted: int = 0) -> DataFile:
    stats = {("min", "vnode"): vnodes[0], ("max", "vnode"): vnodes[1]}
    for i, c in enumerate(order.columns):
        values = [k[i] for k in keys]
        stats[("min", c.name)], stats[("max", c.name)] = min(values), max(values)
    dv = {"cardinality": deleted} if deleted else None
    return DataFile(name, 1, rows or len(keys), {}, stats, dv)


def _sorted_files(vnode: int, start: int, count: int, per_file: int) -> list[DataFile]:
    return [_file(f"v{vnode}-{i}", (vnode, vnode),
                  [(k,) for k in range(start + i * per_file, start + (i + 1) * per_file)],
                  SINGLE) for i in range(count)]


def test_a_chunk_reads_only_the_files_after_the_position_up_to_the_limit():
    files = _sorted_files(3, 0, 50, 100) + _sorted_files(4, 0, 50, 100)
    picked = chunk_files(files, SINGLE, {3: (1234,), 4: None}, 150, shared=False)
    assert [f.path for f in picked.groups[(3,)]] == ["v3-12", "v3-13", "v3-14"]
    assert [f.path for f in picked.groups[(4,)]] == ["v4-0", "v4-1"]
    assert picked.rows_scanned == 500  # of 10,000 rows: the remainder is never read


def test_deleted_rows_do_not_count_and_wide_or_unbounded_files_are_always_read():
    files = _sorted_files(3, 0, 10, 100)
    files[1] = _file("v3-1", (3, 3), [(100,), (199,)], SINGLE, rows=100, deleted=90)
    wide = _file("changes", (0, 9), [(5,), (900,)], SINGLE)
    bare = DataFile("no-stats", 1, 10, {}, {}, None)
    before = _file("passed", (3, 3), [(1,), (4,)], SINGLE)
    picked = chunk_files([*files, wide, bare, before], SINGLE, {3: (50,)}, 100, shared=False)
    paths = {f.path for f in picked.groups[(3,)]}
    # v3-1 holds 10 live rows, v3-2 100: (50, 300) holds the chunk, v3-3 is not needed
    assert paths == {"changes", "no-stats", "v3-0", "v3-1", "v3-2"}


def test_a_finished_vnode_reads_nothing():
    picked = chunk_files(_sorted_files(3, 0, 5, 10), SINGLE, {3: (None,)}, 10, shared=False)
    assert picked.groups[(3,)] == []


def test_composite_keys_with_a_descending_column_seek_on_both_columns():
    files = [_file(f"{r}-{i}", (1, 1), [(r, k) for k in range(i * 10, i * 10 + 10)], COMPOSITE)
             for r in ("a", "b", "c") for i in range(5)]
    # key order: region asc, id desc; after ("b", 25): ("b", 24 .. 0), then region c
    picked = chunk_files(files, COMPOSITE, {1: ("b", 25)}, 15, shared=False)
    assert sorted(f.path for f in picked.groups[(1,)]) == ["b-0", "b-1", "b-2"]


def test_shared_reads_count_files_across_the_runs_vnodes():
    files = _sorted_files(1, 0, 10, 10) + _sorted_files(2, 5, 10, 10)
    picked = chunk_files(files, SINGLE, {1: (30,), 2: (30,)}, 20, shared=True)
    assert sorted(f.path for f in picked.groups[(1, 2)]) == [
        "v1-3", "v1-4", "v2-2", "v2-3", "v2-4"]


@pytest.mark.parametrize("shared", [False, True])
def test_take_chunk_equals_a_sort_of_everything(shared):
    rng = random.Random(7)
    keys = rng.sample([(r, k) for r in "abcd" for k in range(200)], 500)
    vnodes = [hash(k) % 4 for k in keys]
    table = pa.table({"region": [k[0] for k in keys], "id": [k[1] for k in keys],
                      "vnode": pa.array(vnodes, pa.int32())})
    pos = {0: ("b", 50), 1: None, 2: ("d", 0), 3: ("a", 10)}
    if shared:
        pos = dict.fromkeys(pos, ("b", 120))
    got = take_chunk(table, COMPOSITE, {v: p for v, p in pos.items() if p}, 30, shared)
    by_key = COMPOSITE.sort_key
    rows = [(v, k) for k, v in zip(keys, vnodes, strict=True)
            if pos[v] is None or COMPOSITE.compare(k, pos[v]) > 0]
    if shared:
        rows = sorted(rows, key=lambda r: by_key(r[1]))[:30]
    expected = []
    for v in range(4):
        mine = sorted((k for w, k in rows if w == v), key=by_key)
        expected += [(v, k, i + 1) for i, k in enumerate(mine if shared else mine[:30])]
    assert list(zip(got.column("vnode").to_pylist(),
                    zip(got.column("region").to_pylist(), got.column("id").to_pylist(),
                        strict=True),
                    got.column("__bf_rn").to_pylist(), strict=True)) == expected
    assert not any(got.column("__bf_bad_key").to_pylist())
