"""no_shuffle's read window (``storage.windowed_cut``): a run's barriers take their chunks from
rows held between barriers, kept at each barrier's version by the change feed, and every chunk
equals the first ``limit`` rows after the position in the upstream at that version.

The oracle is a model of the upstream kept by the test (a list of rows, duplicates included),
changed as the writer changes the real Delta table between barriers: inserts, updates,
deletes, pk changes (our writer: deletion vectors and change-data files) and a second row for
a held pk (a plain append). No Spark: the window runs on the driver.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile

import pyarrow as pa
from deltalake import write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    Snapshot,
    apply_keyed,
    chunk_files,
    cut_window,
    ensure_mor_table,
    file_reader,
    window_read,
    windowed_cut,
)
from backfill_assets.storage.window_spill import Spill
from tests.storage.test_shared_cut import SCHEMA, VNODES, key_orders  # the same upstream


def _row(region: str, id_: int, name: str | None = None) -> dict:
    return {"region": region, "id": id_, "name": name or f"{region}{id_}", "vnode": id_ % VNODES}


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


class _Upstream:
    """A real Delta upstream and the model of its rows."""

    def __init__(self, uri: str, key_order: KeyOrder):
        self.uri, self.key_order, self.rows, self.commits = uri, key_order, [], 0
        ensure_mor_table(uri, SCHEMA, None, cdf=True,
                         configuration={"backfill.vnodeCount": str(VNODES)})

    def key(self, row: dict) -> tuple:
        return tuple(row[c] for c in self.key_order.names)

    def append(self, rows: list[dict]) -> None:
        write_deltalake(self.uri, _table(rows), mode="append")
        self.rows += rows

    def change(self, before: list[dict], after: list[dict]) -> None:
        """Our writer's commit: ``before`` rows deleted, ``after`` rows inserted."""
        self.commits += 1
        apply_keyed(Snapshot.load(self.uri), list(self.key_order.names),
                    Intent({"t/up/0": self.commits}), KeyedRows(_table(before), _table(after)))
        gone = {self.key(r) for r in before}
        self.rows = [r for r in self.rows if self.key(r) not in gone] + after

    def expected(self, run: list[int], pos: tuple | None, limit: int) -> tuple:
        """(cut, rows): the ``limit``-th key after ``pos`` among the run's rows (None: fewer)
        and every row at or before it."""
        order = functools.cmp_to_key(self.key_order.compare)
        live = sorted((r for r in self.rows if r["vnode"] in run
                       and (pos is None or self.key_order.compare(self.key(r), pos) > 0)),
                      key=lambda r: order(self.key(r)))
        if len(live) < limit:
            return None, live
        cut = self.key(live[limit - 1])
        return cut, [r for r in live if self.key_order.compare(self.key(r), cut) <= 0]


def _barrier(up: _Upstream, run: list[int], pos: tuple | None, limit: int, reads: list):
    snap = Snapshot.load(up.uri)
    positions = dict.fromkeys(run, pos)

    def pick(n: int):
        picked = chunk_files(snap.files, up.key_order, positions, n, shared=True)
        return picked.distinct, picked.floors

    reader = file_reader(snap, SCHEMA.names)

    def counted(f):
        reads.append(f.path)
        return reader(f)

    return windowed_cut(snap, up.key_order, run, pos, limit, pick, counted, SCHEMA.names)


def _sorted_rows(rows) -> list[tuple]:
    """Rows as comparable tuples; a held table (None: no file held a row) or dicts."""
    if isinstance(rows, pa.Table) or rows is None:
        rows = [] if rows is None else rows.to_pylist()
    return sorted((r["region"], r["id"], r["name"], r["vnode"]) for r in rows)


@st.composite
def _case(draw, spilling: bool = False):
    """A run's upstream, writer and window knobs; ``spilling``: a window of few rows over a
    run of many, every file sampled: its read spills the rest in buckets, and the run loads
    them (storage/window_spill.py)."""
    key_order = draw(key_orders())
    ids = draw(st.lists(st.integers(0, 300), min_size=30 if spilling else 1, max_size=80,
                        unique=True))
    keys = [(draw(st.sampled_from("abc")), i) for i in ids]
    files = draw(st.integers(1, 3))
    if spilling:  # files that each span the key range (a writer's layout): dealt round-robin
        def key(k: tuple) -> tuple:
            return tuple({"region": k[0], "id": k[1]}[c] for c in key_order.names)

        keys.sort(key=functools.cmp_to_key(lambda a, b: key_order.compare(key(a), key(b))))
        keys = [k for i in range(files) for k in draw(st.permutations(keys[i::files]))]
    run = list(range(VNODES)) if spilling else \
        sorted(draw(st.sets(st.integers(0, VNODES - 1), min_size=1)))
    ops = st.tuples(st.sampled_from(["insert", "update", "delete", "pk_change", "duplicate"]),
                    st.integers(0, 10**6), st.sampled_from("abcd"), st.integers(301, 400))
    # (spilling: fewer change rows than a chunk a barrier, which would read the files again)
    changes = draw(st.lists(st.lists(ops, max_size=1 if spilling else 4), min_size=1,
                            max_size=12))
    # how the window reads: files sampled for its bound, the room that bound leaves (0.5: too
    # tight, the exact cut reads instead; 3: loose, the window is cut to its size), and its
    # chunks (few: the run's rest spills in more buckets, storage/window_spill.py)
    knobs = (draw(st.sampled_from([1, 3, 100])), draw(st.sampled_from([0.5, 1.25, 3.0])),
             draw(st.sampled_from([1.25, 4.25])))
    if spilling:
        knobs = (100, draw(st.sampled_from([0.5, 1.25])), 1.25)
    return (key_order, keys, run, draw(st.integers(3, 5) if spilling else st.integers(1, 5)),
            -(-len(keys) // files) if spilling else draw(st.integers(1, 15)),
            spilling or draw(st.booleans()), changes, knobs)


def _apply(up: _Upstream, ops: list[tuple]) -> None:
    """One writer version per op (an op with nothing to act on is skipped)."""
    for op, pick, region, fresh in ops:
        held = up.rows[pick % len(up.rows)] if up.rows else None
        if op == "insert" and all(up.key(r) != up.key(_row(region, fresh)) for r in up.rows):
            up.change([], [_row(region, fresh)])
        elif held is None or [up.key(r) for r in up.rows].count(up.key(held)) > 1:
            continue  # our writer deletes by key: a doubled pk is left to the key check
        elif op == "update":
            up.change([held], [{**held, "name": f"u{pick}"}])
        elif op == "delete":
            up.change([held], [])
        elif op == "pk_change" and all(up.key(r) != up.key(_row(region, fresh)) for r in up.rows):
            up.change([held], [_row(region, fresh, "moved")])
        elif op == "duplicate":
            up.append([{**held, "name": "second"}])


@settings(max_examples=60, deadline=None)
@given(_case())
def test_every_chunk_equals_the_upstream_at_its_version(case):
    key_order, keys, run, limit, file_rows, shuffled, changes, knobs = case
    saved = window_read._SAMPLE_FILES, window_read.WINDOW_CAP, cut_window.WINDOW_CHUNKS
    window_read._SAMPLE_FILES, window_read.WINDOW_CAP, cut_window.WINDOW_CHUNKS = knobs
    try:
        _run_barriers(key_order, keys, run, limit, file_rows, shuffled, changes)
    finally:
        window_read._SAMPLE_FILES, window_read.WINDOW_CAP, cut_window.WINDOW_CHUNKS = saved
    assert not _spill_dirs()


@settings(max_examples=30, deadline=None)
@given(_case(spilling=True))
def test_every_chunk_equals_the_upstream_when_the_run_spills(case):
    """As above, over runs whose window read spills: every bucket loaded is brought to the
    barrier's version by the feed kept since the read (the feed's rows past the window)."""
    loaded, extend = [], cut_window._extend
    cut_window._extend = lambda *a: loaded.append(extend(*a)) or loaded[-1]
    try:
        test_every_chunk_equals_the_upstream_at_its_version.hypothesis.inner_test(case)
    finally:
        cut_window._extend = extend
    assert any(loaded)


def _run_barriers(key_order, keys, run, limit, file_rows, shuffled, changes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up = _Upstream(f"{tmp}/up", key_order)
        rows = [_row(r, i) for r, i in keys]
        if not shuffled:
            rows.sort(key=lambda r: r["id"])
        for i in range(0, len(rows), file_rows):
            up.append(rows[i:i + file_rows])
        pos, reads = None, []
        for barrier in range(120):
            cut = _barrier(up, run, pos, limit, reads)
            want_cut, want_rows = up.expected(run, pos, limit)
            assert not cut.null_key
            assert cut.key == want_cut, barrier
            assert _sorted_rows(cut.held) == _sorted_rows(want_rows), barrier
            if cut.key is None:
                break
            pos = cut.key
            _apply(up, changes[barrier % len(changes)])
        else:
            raise AssertionError("the run did not finish")


def _count_reads(tmp_path, name: str) -> list[tuple[int, int]]:
    """40 rows, chunks of 5, a pre- and a post-image between barriers: per barrier, (files
    read, rows it decoded), each chunk checked against the model."""
    key_order = KeyOrder((KeyColumn("id", "bigint"),))
    up = _Upstream(str(tmp_path / name), key_order)
    up.append([_row("a", i) for i in range(40, 0, -1)])
    run, pos, reads, taken = list(range(VNODES)), None, [], []
    for _ in range(10):
        before = len(reads)
        cut = _barrier(up, run, pos, 5, reads)
        assert (cut.key, _sorted_rows(cut.held)) == \
            (up.expected(run, pos, 5)[0], _sorted_rows(up.expected(run, pos, 5)[1]))
        taken.append((len(reads) - before, cut.rows_read))
        if cut.key is None:
            break
        pos = cut.key
        held = next((r for r in up.rows if r["id"] == pos[0] + 3), None)
        if held is not None:
            up.change([held], [{**held, "name": "changed"}])
    return taken


def _spill_dirs() -> list[str]:
    return [d for d in os.listdir(tempfile.gettempdir())
            if d.startswith(f"backfill-window-{os.getpid()}-")]


def test_a_window_and_its_spill_serve_the_run_from_one_read(tmp_path):
    """The first barrier reads the files once: it holds four chunks or more and spills the
    rest to local disk in buckets; every later barrier takes its chunk from the window, then
    from the buckets it loads, with the writer's changes applied from the feed (read: its
    change rows only). The spill's files are gone when the run ends."""
    taken = _count_reads(tmp_path, "up")
    assert len(taken) == 9 and [n for n, _ in taken] == [1] + [0] * 8
    assert all(r == 2 for _, r in taken[1:-1])  # the feed's rows, not the files'
    assert not _spill_dirs()


def test_without_room_to_spill_the_files_are_read_again(tmp_path, monkeypatch):
    """A spill with no room (``SPILL_MAX_BYTES``): the window alone, and a barrier past it
    reads the files again."""
    monkeypatch.setattr(window_read, "SPILL_MAX_BYTES", 1)
    files_read = [n for n, _ in _count_reads(tmp_path, "up")]
    assert files_read[:4] == [1, 0, 0, 0] and any(files_read[4:])


def test_a_killed_process_spill_is_removed_by_the_next(tmp_path):
    """A process killed with a window held leaves its spill directory; the next spill (any
    process) removes it."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    orphan = os.path.join(tempfile.gettempdir(), f"backfill-window-{child.stdout.strip()}-x")
    os.makedirs(orphan)
    Spill(SCHEMA, [None]).discard()
    assert not os.path.exists(orphan)


def test_a_null_pk_stops_the_cut_whether_the_files_or_the_feed_bring_it(tmp_path):
    """A row of the run with a null pk (a foreign writer's append) yields no cut, so the Spark
    path names it: when a window read meets it in the files, and when the feed brings it to
    a window already held. The key masks (rows after the position) would drop it unseen."""
    key_order = KeyOrder((KeyColumn("id", "bigint"),))
    run = list(range(VNODES))
    for null_first in (True, False):
        up = _Upstream(str(tmp_path / f"up{null_first}"), key_order)
        up.append([_row("a", i) for i in range(1, 41)])
        null_row = {"region": "a", "id": None, "name": "null pk", "vnode": 1}
        if null_first:
            write_deltalake(up.uri, _table([null_row]), mode="append")
            assert _barrier(up, run, (10,), 5, []).null_key  # a read past the position
            continue
        cut = _barrier(up, run, None, 5, [])
        assert cut.key == (5,) and not cut.null_key  # the window holds the next chunks
        write_deltalake(up.uri, _table([null_row]), mode="append")
        assert _barrier(up, run, cut.key, 5, []).null_key
