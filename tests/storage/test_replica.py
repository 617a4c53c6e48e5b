"""The arrangement replica as base rows plus appended change rows (storage/rows/replica.py).

Generated replicas (composite keys with a descending column, vnodes with no base file,
several files per vnode) take generated change batches (updates, deletes, inserts anywhere in
the key range, a key deleted then inserted again), appended as change files at increasing
versions. An independent model (a dict per vnode, the batches applied in order) is the oracle:

- every chunk read (the seek, over-picked by tombstones, then the read tasks, run here in
  the test process as Spark would run them) is a prefix of the model's keys after each
  position, row for row: all of them, said exhausted, exactly when they are at most
  ``limit + tail`` (a vnode's last sliver is read with its last chunk); else ``limit`` rows,
  or a count within ``tail`` of it that ends where a file ends (``core.positions.chunk_cut``);
- walking a vnode chunk by chunk, a chunk that starts where a file starts reads that file
  alone, however many rows were deleted or inserted before it;
- folding the change files into one (``merge_changes``) changes no read;
- nothing of the base is ever rewritten (no remove, no DV).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.positions import chunk_window, rows_to_see
from backfill_assets.storage import Intent, TableVersion, chunk_files, chunk_tasks, ensure_mor_table
from backfill_assets.storage.chunks.seek import SEEK_ROWS_PROPERTY
from backfill_assets.storage.rows import replica
from backfill_assets.storage.rows.commit import Change, commit
from backfill_assets.storage.rows.write import write_table

DATA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("val", pa.int32()),
                  ("vnode", pa.int32())])
KEYS = KeyOrder((KeyColumn("a", "bigint"), KeyColumn("b", "string", descending=True)))
SINGLE = KeyOrder((KeyColumn("a", "bigint"),))
SINGLE_DESC = KeyOrder((KeyColumn("a", "bigint", descending=True),))
VNODES = 4
FILE_ROWS = 3


def _row(vnode: int, key: tuple, val: int) -> dict:
    return {"a": key[0], "b": key[1] if len(key) > 1 else "x", "val": val, "vnode": vnode}


@st.composite
def histories(draw, key_order: KeyOrder = KEYS):
    keys = st.tuples(st.integers(0, 30), st.sampled_from(["x", "y", "z"])) \
        if len(key_order.columns) > 1 else st.tuples(st.integers(0, 60))
    base = {v: {k: draw(st.integers(0, 99)) for k in draw(st.sets(keys, max_size=14))}
            for v in range(VNODES)}
    batches = []
    for _ in range(draw(st.integers(0, 20))):
        batch = {}
        for _ in range(draw(st.integers(0, 8))):
            vnode = draw(st.integers(0, VNODES - 1))
            held = sorted(base[vnode], key=key_order.sort_key)
            # mostly the base's own keys, its first ones most (what a chunk reads first)
            key = draw(st.sampled_from(held[:4]) | st.sampled_from(held) | keys) if held \
                else draw(keys)
            batch[(vnode, key)] = draw(st.none() | st.none() | st.integers(0, 99))  # None: delete
        batches.append(batch)
    positions = {v: draw(st.none() | keys) for v in range(VNODES)}
    return base, batches, positions, draw(st.integers(1, 12)), key_order


def _build(uri: str, base: dict, key_order: KeyOrder = KEYS, exact: bool = False,
           file_rows: int = FILE_ROWS) -> None:
    ensure_mor_table(uri, replica.table_schema(DATA), {}, cdf=False,
                     configuration={SEEK_ROWS_PROPERTY: str(file_rows)})
    adds = []
    for vnode, rows in base.items():
        ordered = sorted(rows, key=key_order.sort_key)
        table = pa.Table.from_pylist([_row(vnode, k, rows[k]) for k in ordered], DATA)
        adds += write_table(replica.tagged(table, 1), uri, {}, replica.table_schema(DATA),
                            max_rows_per_file=file_rows, key_sort=[
                                (c.name, "descending" if c.descending else "ascending")
                                for c in key_order.columns] if exact else None)
    commit(TableVersion.load(uri, None, {}), Change(adds=adds), Intent())


def _append(uri: str, batch: dict, version: int) -> None:
    snap = TableVersion.load(uri, None, {})
    after = [_row(v, k, val) for (v, k), val in batch.items() if val is not None]
    gone = [_row(v, k, 0) for (v, k), val in batch.items() if val is None]
    replica.append_changes(snap, replica.change_rows(pa.Table.from_pylist(after, DATA),
                                         pa.Table.from_pylist(gone, DATA), version,
                                         snap.arrow_schema), Intent())


def _read(uri: str, positions: dict, limit: int, key_order: KeyOrder = KEYS, tail: int = 0
          ) -> dict[int, list[dict]]:
    """One chunk read, its tasks run here (what Spark's tasks run)."""
    return _read_cut(uri, positions, limit, key_order, tail)[0]


def _read_cut(uri: str, positions: dict, limit: int, key_order: KeyOrder = KEYS,
              tail: int = 0) -> tuple[dict[int, list[dict]], set[int]]:
    """One chunk read and the vnodes it exhausted."""
    snap = TableVersion.load(uri, None, {})
    changes = replica.read_changes(snap, positions)
    picked = chunk_files(replica.base_files(snap), key_order, positions, rows_to_see(limit, tail),
                         False, replica.tombstones(changes))
    tasks, reader = chunk_tasks(snap, DATA.names, key_order, positions, limit, picked, False,
                                changes, tail=tail)
    out: dict[int, list[dict]] = {}
    exhausted: set[int] = set()
    for task in tasks:
        chunk, done = reader.read(json.loads(task))
        exhausted |= done
        for row in chunk.select(DATA.names).to_pylist():
            out.setdefault(row["vnode"], []).append(row)
    return out, exhausted


def _model(base: dict, batches: list, positions: dict, key_order: KeyOrder = KEYS
           ) -> dict[int, list[dict]]:
    """Every row after each vnode's position, in key order (vnodes with none left out)."""
    state = {v: dict(rows) for v, rows in base.items()}
    for batch in batches:
        for (vnode, key), val in batch.items():
            if val is None:
                state[vnode].pop(key, None)
            else:
                state[vnode][key] = val
    out = {}
    for vnode, rows in state.items():
        pos = positions[vnode]
        after = sorted((k for k in rows if pos is None or key_order.compare(k, pos) > 0),
                       key=key_order.sort_key)
        if after:
            out[vnode] = [_row(vnode, k, rows[k]) for k in after]
    return out


@settings(max_examples=90, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from([KEYS, SINGLE, SINGLE_DESC]).flatmap(histories), st.booleans(),
       st.sampled_from([0, 0, 1, 3, 12]))
def test_chunk_reads_of_base_plus_changes_equal_the_model(tmp_path_factory, history, exact,
                                                          tail):
    """Composite keys go through Arrow masks; a single integer key through the task's
    binary searches over key-ordered files (ascending and descending); ``exact``: the base
    files carry their exact first and last key (what the replica's copy records), else the
    seek works from per-column stats. ``tail``: a vnode's rest of at most ``limit + tail``
    rows is read whole, in whatever files and change rows it lies."""
    base, batches, positions, limit, key_order = history
    uri = str(tmp_path_factory.mktemp("replica") / "t")
    _build(uri, base, key_order, exact)
    for version, batch in enumerate(batches, start=2):
        _append(uri, batch, version)
    rest = _model(base, batches, positions, key_order)
    got, exhausted = _read_cut(uri, positions, limit, key_order, tail)
    _check_chunks(got, exhausted, rest, limit, tail, positions)
    snap = TableVersion.load(uri, None, {})
    assert not any(f.deletion_vector for f in snap.files)  # the base is never rewritten
    if replica.merge_changes(snap, key_order, Intent()):
        folded = TableVersion.load(uri, None, {})
        assert len(replica.change_files(folded)) == 1
        assert _read_cut(uri, positions, limit, key_order, tail) == (got, exhausted)


def _check_chunks(got: dict, exhausted: set, rest: dict, limit: int, tail: int,
                  vnodes) -> None:
    low, high = chunk_window(limit, tail)
    for v in vnodes:
        mine, left = got.get(v, []), rest.get(v, [])
        assert mine == left[:len(mine)], v  # row for row, a prefix of the vnode's rest
        if len(left) <= limit + tail:  # a vnode no task holds (nothing left) reads 0 rows
            assert (v in exhausted or not left) and len(mine) == len(left), v
        else:
            assert v not in exhausted and low <= len(mine) <= high, v
            assert len(mine) == limit or tail, v  # throttled (no tail): exactly the limit


def test_a_chunk_that_ends_where_a_file_ends_leaves_the_next_one_a_file(tmp_path,
                                                                         monkeypatch):
    """Files of a chunk's rows; deletes and inserts move the row counts off the limit. Each
    chunk still ends at a file's end (within the tail), so each reads one file, but for the
    last but one: it also reads the last, to know whether the rest fits in ``limit + tail``
    (it does not: 16 rows). Together the chunks are the vnode's rows."""
    from backfill_assets.storage.chunks import chunk_task

    uri = str(tmp_path / "t")
    rows = {(k,): k for k in range(0, 80, 2)}  # 40 rows: five files of 8
    _build(uri, {0: rows, 1: {}, 2: {}, 3: {}}, SINGLE, exact=True, file_rows=8)
    _append(uri, {(0, (10,)): None, (0, (21,)): 21, (0, (34,)): None, (0, (35,)): 35}, 2)
    read: list[str] = []
    real = chunk_task.file_table
    monkeypatch.setattr(chunk_task, "file_table",
                        lambda *a: read.append(a[-1]["path"]) or real(*a))
    want = _model({0: rows}, [{(0, (10,)): None, (0, (21,)): 21, (0, (34,)): None,
                               (0, (35,)): 35}], {0: None}, SINGLE)[0]
    walked, pos, reads = [], None, []
    for _ in range(8):
        got, exhausted = _read_cut(uri, {0: pos}, 8, SINGLE, tail=2)
        reads.append(len(read))
        read.clear()
        walked += got[0]
        pos = (got[0][-1]["a"],)
        if 0 in exhausted:
            break
    assert walked == want
    assert reads == [1, 1, 1, 2, 1]


def test_the_copys_first_chunk_ends_where_the_first_replica_file_ends():
    """The replica's copy writes each vnode's first chunk from the rows it sorted: up to
    the end of the vnode's first file when that is within the tail of the limit, all of a
    vnode within ``limit + tail`` (exhausted), else exactly the limit."""
    from backfill_assets.storage.chunks.chunk_task import first_of_each_vnode

    sizes = {0: 20, 1: 10, 2: 3}
    table = pa.table({"vnode": pa.array([v for v, n in sizes.items() for _ in range(n)],
                                        pa.int32()),
                      "a": pa.array([k for n in sizes.values() for k in range(n)], pa.int64())})
    for boundary, first in [(9, 9), (0, 8), (12, 8), (6, 6)]:
        got, exhausted = first_of_each_vnode(table, 8, 2, boundary)
        counts = dict(zip(*np.unique(got.column("vnode").to_numpy(), return_counts=True),
                          strict=True))
        assert counts == {0: first, 1: 10, 2: 3}, boundary
        assert exhausted == {1, 2}
        assert got.column("a").to_pylist()[:first] == list(range(first))


def test_change_files_are_folded_past_the_limit(tmp_path):
    uri = str(tmp_path / "t")
    _build(uri, {v: {(1, "x"): 1} for v in range(VNODES)})
    for version in range(2, replica.MAX_CHANGE_FILES + 3):
        _append(uri, {(0, (version, "y")): version, (1, (1, "x")): None}, version)
    snap = TableVersion.load(uri, None, {})
    assert len(replica.change_files(snap)) == replica.MAX_CHANGE_FILES + 1
    assert replica.merge_changes(snap, KEYS, Intent())
    after = TableVersion.load(uri, None, {})
    changes = replica.read_changes(after)
    assert len(replica.change_files(after)) == 1
    assert changes.num_rows == replica.MAX_CHANGE_FILES + 2  # one row per key: the newest
    assert replica.tombstones(changes) == {1: 1}
    read = _read(uri, dict.fromkeys(range(VNODES)), 100)
    assert 1 not in read  # its one key deleted (again and again)
    assert [r["a"] for r in read[0]] == [1, *range(2, replica.MAX_CHANGE_FILES + 3)]


def test_a_replica_from_before_the_version_columns_is_given_them(tmp_path):
    """A replica written by an earlier release (no version columns, kept exact by DVs) is
    migrated in place: its rows read as the oldest version, change rows appended since win."""
    uri = str(tmp_path / "t")
    table = ensure_mor_table(uri, DATA, {}, cdf=False,
                             configuration={SEEK_ROWS_PROPERTY: str(FILE_ROWS)})
    old = pa.Table.from_pylist([_row(0, (k, "x"), k) for k in range(5)], DATA)
    commit(TableVersion.load(uri, None, {}), Change(adds=write_table(old, uri, {}, DATA)), Intent())
    table.update_incremental()
    replica.with_version_columns(table)
    _append(uri, {(0, (1, "x")): None, (0, (2, "x")): 20, (0, (9, "x")): 9}, 7)
    got = _read(uri, dict.fromkeys(range(VNODES)), 10)
    assert [(r["a"], r["val"]) for r in got[0]] == [(0, 0), (2, 20), (3, 3), (4, 4), (9, 9)]


def test_exact_key_bounds_reach_the_log_and_narrow_a_composite_seek(tmp_path):
    """Files of one vnode whose per-column stats overlap (each spans two values of the first
    key column) but whose exact bounds do not: with the bounds, the seek takes only the file
    holding the position and the next one."""
    uri = str(tmp_path / "t")
    rows = {(a, b): a for a in range(12) for b in ("x", "y")}
    _build(uri, {0: rows, 1: {}, 2: {}, 3: {}}, KEYS, exact=True)
    snap = TableVersion.load(uri, None, {})
    tags = [json.loads(f.add_action["tags"]["backfill.keyBounds"]) for f in snap.files]
    assert sorted(tags) == sorted([list(map(list, [k[0], k[-1]])) for k in (
        sorted(rows, key=KEYS.sort_key)[i:i + FILE_ROWS]
        for i in range(0, len(rows), FILE_ROWS))])
    positions = {0: (4, "x"), 1: None, 2: None, 3: None}
    picked = chunk_files(replica.base_files(snap), KEYS, positions, 2, False)
    assert len(picked.groups[(0,)]) <= 2
    assert _read(uri, positions, 2)[0] == [_row(0, k, k[0]) for k in [(5, "y"), (5, "x")]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["x", "y"])), min_size=1,
                max_size=30), st.booleans())
def test_key_bounds_are_the_first_and_last_key_whatever_the_row_order(keys, presort):
    """In key order (the copy's files) they are the first and last rows; else a sort."""
    from backfill_assets.storage.rows.write import _key_bounds

    order = [("a", "ascending"), ("b", "descending")]
    if presort:
        keys = sorted(keys, key=KEYS.sort_key)
    table = pa.table({"a": pa.array([k[0] for k in keys], pa.int64()),
                      "b": pa.array([k[1] for k in keys])})
    ordered = sorted(keys, key=KEYS.sort_key)
    assert _key_bounds([table], order) == [list(ordered[0]), list(ordered[-1])]


def test_a_fold_that_loses_the_race_leaves_nothing(tmp_path):
    """Two runs over different vnodes may fold the same change files at once: the loser's
    commit is refused, its file deleted, and the winner's fold reads the same."""
    uri = str(tmp_path / "t")
    _build(uri, {v: {(1, "x"): 1} for v in range(VNODES)})
    for version in range(2, replica.MAX_CHANGE_FILES + 3):
        _append(uri, {(version % VNODES, (version, "y")): version}, version)
    stale = TableVersion.load(uri, None, {})
    want = _read(uri, dict.fromkeys(range(VNODES)), 100)
    assert replica.merge_changes(TableVersion.load(uri, None, {}), KEYS, Intent())
    assert not replica.merge_changes(stale, KEYS, Intent())
    after = TableVersion.load(uri, None, {})
    assert len(replica.change_files(after)) == 1
    on_disk = {p.name for p in (tmp_path / "t").glob("change-*.parquet")}
    live = {f.path for f in after.files}
    assert on_disk - live <= {f.path for f in replica.change_files(stale)}  # only the folded ones
    assert _read(uri, dict.fromkeys(range(VNODES)), 100) == want
