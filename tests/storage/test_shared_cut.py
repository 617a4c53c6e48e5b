"""no_shuffle's shared cut (``storage.shared_cut``) is the ``limit``-th live key after the
position among the run's vnodes, whatever the files' layout, and the chunk tasks that read only
the files it names and keep each vnode's rows up to it read exactly the first ``limit`` rows:
checked against a sort of the rows the test wrote, over generated key orders (one or two
columns, either direction), file sizes, layouts (our writer's key-sorted files with exact
bounds; appended files in id order, regions mixed, as an ingesting upstream's; shuffled
files), deletion vectors, positions and runs. No Spark: the cut runs on the driver, the tasks
here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import (
    HeldChunk,
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    chunk_files,
    chunk_tasks,
    ensure_mor_table,
    file_reader,
)
from backfill_assets.storage.chunks.chunk_task import BAD_KEY
from backfill_assets.storage.chunks.key_ranks import packed_ranks
from backfill_assets.storage.chunks.shared_cut import shared_cut

SCHEMA = pa.schema([("region", pa.string()), ("id", pa.int64()), ("name", pa.string()),
                    ("vnode", pa.int32())])
VNODES = 4


def _rows(keys) -> pa.Table:
    return pa.Table.from_pylist([{"region": r, "id": i, "name": f"{r}{i}", "vnode": i % VNODES}
                                 for r, i in keys], schema=SCHEMA)


@st.composite
def key_orders(draw) -> KeyOrder:
    """(id) or (region, id), each column in either direction."""
    columns = [KeyColumn("id", "bigint", descending=draw(st.booleans()))]
    if draw(st.booleans()):
        columns.insert(0, KeyColumn("region", "string", descending=draw(st.booleans())))
    return KeyOrder(tuple(columns))


@st.composite
def _case(draw):
    key_order = draw(key_orders())
    composite = len(key_order.columns) == 2
    keys = draw(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 200)), min_size=1,
                         max_size=60, unique_by=(lambda k: k) if composite else (lambda k: k[1])))
    deleted = draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys) // 2))
    run = draw(st.sets(st.integers(0, VNODES - 1), min_size=1))
    pos = draw(st.none() | st.sampled_from(keys))
    layout = draw(st.sampled_from(["keyed", "by_id", "shuffled"]))
    if layout == "shuffled":
        keys = draw(st.permutations(keys))
    return (key_order, keys, deleted, sorted(run), pos,
            draw(st.integers(1, 25)), draw(st.integers(1, 12)), layout)


@settings(max_examples=40, deadline=None)
@given(_case())
def test_the_cut_is_the_limit_th_live_key_after_the_position_in_the_run(case):
    key_order, keys, deleted, run, pos, limit, file_rows, layout = case
    names = key_order.names

    def key(row: tuple) -> tuple:
        return (row[0], row[1]) if len(names) == 2 else (row[1],)

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/up"
        ensure_mor_table(uri, SCHEMA, None, cdf=True,
                         configuration={"backfill.vnodeCount": str(VNODES)})
        if layout == "keyed":  # (vnode, key)-sorted files, their exact bounds tagged
            apply_keyed(TableVersion.load(uri), names, Intent({"t/up/0": 0}),
                        KeyedRows(_rows([]), _rows(keys)), file_rows=file_rows)
        else:  # files as an upstream appends them: stats only, a box per file
            ordered = sorted(keys, key=lambda k: k[1]) if layout == "by_id" else keys
            for i in range(0, len(ordered), file_rows):
                write_deltalake(uri, _rows(ordered[i:i + file_rows]), mode="append")
        if deleted:  # deletion vectors on the files that hold them
            apply_keyed(TableVersion.load(uri), names, Intent({"t/up/0": 1}),
                        KeyedRows(_rows(deleted), _rows([])))
        snap = TableVersion.load(uri)
        start = None if pos is None else key(pos)
        positions = {v: start for v in run}
        picked = chunk_files(snap.files, key_order, positions, limit, shared=True)
        cut = shared_cut(snap, picked.distinct, key_order, run, start, limit, picked.floors)
        # the chunk tasks, run here, on the files the cut names: each vnode keeps its rows in
        # (position, cut]
        tasks, reader = chunk_tasks(snap, SCHEMA.names, key_order, positions, limit,
                                    picked.only(lambda f: f.path in cut.files), True, cut=cut)
        read = [reader.read(json.loads(t))[0] for t in tasks]
        # the one-read cut (tasks run in this process): whole rows held, the chunk taken
        # from them in vnode ranges, with no second read of a file
        whole = shared_cut(snap, picked.distinct, key_order, run, start, limit, picked.floors,
                           file_reader(snap, SCHEMA.names))
        held = HeldChunk(whole.held, key_order) if whole.held is not None else None
        held_read = [held.read(json.loads(t))[0] for t in held.tasks(2)] if held else []

    order = functools.cmp_to_key(key_order.compare)
    live = sorted((key(k) for k in keys if k not in deleted and k[1] % VNODES in run), key=order)
    if start is not None:
        live = [k for k in live if key_order.compare(k, start) > 0]
    assert not cut.null_key
    if len(live) < limit:
        assert (cut.key, cut.rows) == (None, len(live))
    else:
        assert (cut.key, cut.rows) == (live[limit - 1], limit)
    assert (whole.key, whole.rows, whole.null_key) == (cut.key, cut.rows, False)
    # what the barrier reports it read: every file the cut read, at least those it names
    live_of = {f.path: f.live_records or 0 for f in picked.distinct}
    for c in (cut, whole):
        assert sum(live_of[p] for p in c.files) <= c.rows_read <= sum(live_of.values())

    def rows(tables: list[pa.Table]) -> list[dict]:
        return sorted((r for t in tables for r in t.to_pylist()),
                      key=lambda r: (r["vnode"], r["region"], r["id"]))

    assert rows(held_read) == rows(read)  # every column, the ranks and key flags too
    chunk = pa.concat_tables(read) if read else None
    got = [] if chunk is None else [key((r["region"], r["id"])) for r in chunk.to_pylist()]
    assert sorted(got, key=order) == live[:limit]
    if chunk is not None:  # each task's rows in (vnode, key) order, ranked per vnode
        assert not any(chunk.column(BAD_KEY).to_pylist())


def test_the_one_read_cut_keeps_every_row_at_its_bound(tmp_path):
    """A pk held twice at the bound of a fold (the cut holding whole rows keeps the first
    ``limit`` keys after each fold) reaches the chunk twice, so its key check flags it: a
    fold keeping exactly ``limit`` rows would drop one copy, and the next chunk would start
    after that key, losing the row unseen."""
    uri = str(tmp_path / "up")
    ensure_mor_table(uri, SCHEMA, None, cdf=True,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    write_deltalake(uri, _rows([*(("a", i) for i in range(1, 11)), ("a", 5)]), mode="append")
    write_deltalake(uri, _rows([("a", i) for i in range(11, 21)]), mode="append")
    snap = TableVersion.load(uri)
    key_order = KeyOrder((KeyColumn("id", "bigint"),))
    run = list(range(VNODES))
    positions = dict.fromkeys(run)
    picked = chunk_files(snap.files, key_order, positions, 5, shared=True)
    whole = shared_cut(snap, picked.distinct, key_order, run, None, 5, picked.floors,
                       file_reader(snap, SCHEMA.names))
    assert whole.key == (5,)
    held = HeldChunk(whole.held, key_order)
    chunk = pa.concat_tables([held.read(json.loads(t))[0] for t in held.tasks(2)])
    assert sorted(chunk.column("id").to_pylist()) == [1, 2, 3, 4, 5, 5]
    assert chunk.column(BAD_KEY).to_pylist().count(True) == 1


def test_the_cut_reports_every_file_it_read_not_only_those_holding_the_chunk(tmp_path):
    """Two files of one floor, (a, 1): the chunk, (a, 1), lies in the first, but nothing
    lets the cut stop between files of one floor, and the second's rows, (a, 50) and (b, 1),
    only sort after it once read (its box of regions x ids admits (a, 1)). The barrier
    decoded both: what it reports (``rows_read``, the barrier's ``snapshot_rows_scanned``)
    counts both in either mode, while ``files`` names only the first."""
    uri = str(tmp_path / "up")
    ensure_mor_table(uri, SCHEMA, None, cdf=True,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    write_deltalake(uri, _rows([("a", 1), ("a", 2)]), mode="append")
    write_deltalake(uri, _rows([("a", 50), ("b", 1)]), mode="append")
    snap = TableVersion.load(uri)
    key_order = KeyOrder((KeyColumn("region", "string"), KeyColumn("id", "bigint")))
    run = list(range(VNODES))
    picked = chunk_files(snap.files, key_order, dict.fromkeys(run), 1, shared=True)
    for reader in (None, file_reader(snap, SCHEMA.names)):
        cut = shared_cut(snap, picked.distinct, key_order, run, None, 1, picked.floors, reader)
        assert cut.key == ("a", 1) and len(cut.files) == 1
        assert cut.rows_read == 4, reader


def test_a_first_bound_estimated_too_tight_is_read_again_without_it(tmp_path):
    """Four files of one floor, (a, 0): the first holds (a, 1..21) but (a, 9), which a
    second holds among (a, 1000..). The cap estimated from the first file (its rows' share
    of the chunk, ``CAP`` chunks of room) lands at (a, 8), under which only 8 rows lie,
    fewer than the 15 of the chunk, and (a, 9) was not held: the cut is read again without
    a cap and is exact ((a, 15), not (a, 16)), and both reads are reported."""
    uri = str(tmp_path / "up")
    ensure_mor_table(uri, SCHEMA, None, cdf=True,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    write_deltalake(uri, _rows([*(("a", i) for i in range(1, 22) if i != 9), ("b", 0)]),
                    mode="append")
    for n, region in enumerate("cde"):
        base = 1000 + 100 * n
        low = [("a", 9)] if region == "c" else [("a", base + 19)]
        write_deltalake(uri, _rows([*(("a", base + i) for i in range(19)), *low, (region, 0)]),
                        mode="append")
    snap = TableVersion.load(uri)
    key_order = KeyOrder((KeyColumn("region", "string"), KeyColumn("id", "bigint")))
    run = list(range(VNODES))
    picked = chunk_files(snap.files, key_order, dict.fromkeys(run), 15, shared=True)
    assert len({str(v) for v in picked.floors.values()}) == 1  # one floor: the cap applies
    # files of one floor are read in any order: the misleading one first
    files = sorted(picked.distinct, key=lambda f: 1 not in pq.read_table(
        snap.file_uri(f.path), columns=["id"]).column("id").to_pylist())
    for reader in (None, file_reader(snap, SCHEMA.names)):
        cut = shared_cut(snap, files, key_order, run, None, 15, picked.floors, reader)
        assert (cut.key, cut.rows) == (("a", 15), 15)
        assert cut.rows_read == 2 * 84, reader  # the capped read, then the read without
        if reader is not None:
            assert sorted(cut.held.column("id").to_pylist()) == list(range(1, 16))
    assert any(9 in pq.read_table(snap.file_uri(f.path), columns=["id"]).column(
        "id").to_pylist() for f in files[1:])  # (a, 9) lies past the first file


@st.composite
def _one_floor(draw):
    """Files that each span the key range, all holding a key at or before the position, so
    they share one floor (the writer's copy-on-write layout): where the estimated cap
    applies."""
    ids = draw(st.lists(st.integers(0, 400), min_size=4, max_size=80, unique=True))
    files = draw(st.integers(2, 6))
    parts = [ids[i::files] for i in range(files)]
    parts = [p for p in parts if p]
    pos = max(min(p) for p in parts)
    return parts, pos, draw(st.integers(1, 30))


@settings(max_examples=60, deadline=None)
@given(_one_floor())
def test_a_cut_over_files_of_one_floor_is_exact_with_or_without_its_cap(case):
    parts, pos, limit = case
    key_order = KeyOrder((KeyColumn("region", "string"), KeyColumn("id", "bigint")))
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/up"
        ensure_mor_table(uri, SCHEMA, None, cdf=True,
                         configuration={"backfill.vnodeCount": str(VNODES)})
        for part in parts:
            write_deltalake(uri, _rows([("a", i) for i in part]), mode="append")
        snap = TableVersion.load(uri)
        run = list(range(VNODES))
        start = ("a", pos)
        picked = chunk_files(snap.files, key_order, dict.fromkeys(run, start), limit,
                             shared=True)
        cuts = [shared_cut(snap, picked.distinct, key_order, run, start, limit, picked.floors,
                           reader) for reader in (None, file_reader(snap, SCHEMA.names))]
    live = sorted(i for p in parts for i in p if i > pos)
    want = (("a", live[limit - 1]), limit) if len(live) >= limit else (None, len(live))
    for cut in cuts:
        assert (cut.key, cut.rows) == want
    held = cuts[1].held
    got = [] if held is None else sorted(held.column("id").to_pylist())
    assert got == live[:limit]


_TYPES = {
    "int": (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "bigint": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "string": (pa.string(), st.text(max_size=4)),
    "date": (pa.date32(), st.dates()),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  st.datetimes(timezones=st.just(dt.timezone.utc))),
    "decimal(9,2)": (pa.decimal128(9, 2), st.decimals(-10**6, 10**6, places=2)),
}


@st.composite
def _typed_keys(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=3))
    columns = [KeyColumn(f"k{i}", kind, descending=draw(st.booleans()))
               for i, kind in enumerate(kinds)]
    rows = draw(st.lists(st.tuples(*(_TYPES[k][1] for k in kinds)), min_size=1, max_size=40))
    table = pa.table({f"k{i}": pa.array([r[i] for r in rows], _TYPES[k][0])
                      for i, k in enumerate(kinds)})
    return KeyOrder(tuple(columns)), table


@settings(max_examples=80, deadline=None)
@given(_typed_keys())
def test_packed_ranks_order_rows_as_their_keys_do(case):
    """Where ranks are packed, they order any two rows as the key order does (ties included);
    where they cannot be (over 62 bits), the fold sorts instead."""
    key_order, table = case
    packed = packed_ranks(table, key_order)
    if packed is None:  # refused only when the columns' ranges need more than 62 bits
        assert sum(max(1, _width(table.column(c.name).to_pylist()).bit_length())
                   for c in key_order.columns) > 62
        return
    keys = [tuple(r.values()) for r in table.to_pylist()]
    for i in range(len(keys)):
        for j in range(len(keys)):
            want = key_order.compare(keys[i], keys[j])
            got = int(packed[i] > packed[j]) - int(packed[i] < packed[j])
            assert got == want, (keys[i], keys[j])


def _width(values: list) -> int:
    """What a column's packed codes span, from its Python values: the numeric range of
    integers, dates (days) and timestamps (microseconds), else distinct values - 1."""
    def number(v):
        if isinstance(v, dt.datetime):
            return (v - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(
                microseconds=1)
        if isinstance(v, dt.date):
            return v.toordinal()
        return v
    if all(isinstance(v, int | dt.date) for v in values):
        numbers = [number(v) for v in values]
        return max(numbers) - min(numbers)
    return len(set(values)) - 1
