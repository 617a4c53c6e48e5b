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
import tempfile

import pyarrow as pa
from deltalake import write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    chunk_files,
    ensure_mor_table,
    file_reader,
    windowed_cut,
)
from backfill_assets.storage.chunks import window_scan
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
        apply_keyed(TableVersion.load(self.uri), list(self.key_order.names),
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
    snap = TableVersion.load(up.uri)
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
def _case(draw):
    key_order = draw(key_orders())
    ids = draw(st.lists(st.integers(0, 300), min_size=1, max_size=80, unique=True))
    keys = [(draw(st.sampled_from("abc")), i) for i in ids]
    run = sorted(draw(st.sets(st.integers(0, VNODES - 1), min_size=1)))
    ops = st.tuples(st.sampled_from(["insert", "update", "delete", "pk_change", "duplicate"]),
                    st.integers(0, 10**6), st.sampled_from("abcd"), st.integers(301, 400))
    changes = draw(st.lists(st.lists(ops, max_size=4), min_size=1, max_size=12))
    # how the window reads: files sampled for its bound, and the room that bound leaves (0.5:
    # too tight, the exact cut reads instead; 3: loose, the window is cut to its size)
    knobs = (draw(st.integers(1, 3)), draw(st.sampled_from([0.5, 1.25, 3.0])))
    return (key_order, keys, run, draw(st.integers(1, 5)),
            draw(st.integers(1, 15)), draw(st.booleans()), changes, knobs)


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
    saved = window_scan._SAMPLE_FILES, window_scan.WINDOW_CAP
    window_scan._SAMPLE_FILES, window_scan.WINDOW_CAP = knobs
    try:
        _run_barriers(key_order, keys, run, limit, file_rows, shuffled, changes)
    finally:
        window_scan._SAMPLE_FILES, window_scan.WINDOW_CAP = saved


def _run_barriers(key_order, keys, run, limit, file_rows, shuffled, changes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up = _Upstream(f"{tmp}/up", key_order)
        rows = [_row(r, i) for r, i in keys]
        if not shuffled:
            rows.sort(key=lambda r: r["id"])
        for i in range(0, len(rows), file_rows):
            up.append(rows[i:i + file_rows])
        pos, reads = None, []
        for barrier in range(40):
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


def test_a_window_serves_the_next_chunks_without_reading_files(tmp_path):
    """40 rows, chunks of 5: the first barrier reads the files and holds four chunks or more;
    the next three take theirs from the window, with the writer's changes between them
    applied from the feed (read: its change rows only); a later one reads the files again."""
    key_order = KeyOrder((KeyColumn("id", "bigint"),))
    up = _Upstream(str(tmp_path / "up"), key_order)
    up.append([_row("a", i) for i in range(40, 0, -1)])
    run, pos, reads, taken = list(range(VNODES)), None, [], []
    for _ in range(9):
        before = len(reads)
        cut = _barrier(up, run, pos, 5, reads)
        assert (cut.key, _sorted_rows(cut.held)) == \
            (up.expected(run, pos, 5)[0], _sorted_rows(up.expected(run, pos, 5)[1]))
        taken.append((len(reads) - before, cut.rows_read))
        if cut.key is None:
            break
        pos = cut.key
        held = next((r for r in up.rows if r["id"] == pos[0] + 3), None)
        if held is not None:  # a pre- and a post-image
            up.change([held], [{**held, "name": "changed"}])
    files_read = [n for n, _ in taken]
    assert files_read[:4] == [1, 0, 0, 0]
    assert any(files_read[4:])  # a window of 4 to 5 chunks ends: the files are read again
    assert [r for _, r in taken[1:4]] == [2, 2, 2]  # the feed's rows, not the files'


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
