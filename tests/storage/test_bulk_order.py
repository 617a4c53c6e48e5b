"""A bulk task skips its sort only when its rows are already in (vnode, key) order, and writes
and reports exactly what the sort would (storage/chunks/row_order.py, writes/bulk.py).

No Spark: the source tables are written and committed by the driver (``write_table``,
``commit_written``; deletion vectors by ``apply_keyed``) and each task runs in this process.
The reference is the same task with the order check forced off, i.e. sorting as before.
Layouts: each vnode's files sorted and key-range disjoint (the platform writer's: the sort is
skipped), or rows spread over files at random (overlapping, several vnodes a file); files
with or without min/max stats, read in the log's order or any order; single and composite
keys, either direction; null and repeated pks (nothing written, the same flags reported).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle
from itertools import pairwise

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.storage import (
    BulkRows,
    BulkWritten,
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    commit_written,
    ensure_mor_table,
)
from backfill_assets.storage.chunks import row_order
from backfill_assets.storage.chunks.chunk_scan import whole_vnode_tasks
from backfill_assets.storage.delta.log import DataFile
from backfill_assets.storage.rows.spark_types import exchange_schema
from backfill_assets.storage.rows.write import FileWriter, write_table
from backfill_assets.storage.writes import bulk

SCHEMA = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("qty", pa.int32()),
                    ("vnode", pa.int32())])
VNODES = 4
TYPES = {"k1": "bigint", "k2": "string"}


class Positive:
    """A filter (the MV's shape): rows with qty > 0."""

    keeps_every_row = False

    def __call__(self, rows: pa.Table) -> pa.Table:
        return rows.filter(pc.fill_null(pc.greater(rows.column("qty"), 0), False))


class Every:
    """Every row, in the order given (the replica copy's shape)."""

    keeps_every_row = True

    def __call__(self, rows: pa.Table) -> pa.Table:
        return rows


def _sort_keys(key_order: KeyOrder) -> list[tuple[str, str, str]]:
    return [("vnode", "ascending", "at_end")] + [
        (c.name, "descending" if c.descending else "ascending", "at_end")
        for c in key_order.columns]


def _compare(a: dict, b: dict, order) -> int:
    """The sort's order in Python: nulls after every value in either direction."""
    for name, direction, _ in order:
        x, y = a[name], b[name]
        if x == y:
            continue
        if x is None or y is None:
            return 1 if x is None else -1
        return (-1 if x < y else 1) * (-1 if direction == "descending" else 1)
    return 0


_key_orders = st.lists(st.tuples(st.sampled_from(["k1", "k2"]), st.booleans()), min_size=1,
                       max_size=2, unique_by=lambda c: c[0]).map(
    lambda cols: KeyOrder(tuple(KeyColumn(n, TYPES[n], d) for n, d in cols)))
_row = st.fixed_dictionaries({
    "k1": st.one_of(st.integers(0, 12), st.none()),
    "k2": st.sampled_from(["a", "b", "ü", "", None]),
    "qty": st.one_of(st.integers(-2, 3), st.none()), "vnode": st.integers(0, VNODES - 1)})


@st.composite
def _tables(draw) -> tuple[pa.Table, list]:
    """Rows in any order, or in the sort's (strictly, or with ties), in one or more chunks."""
    order = _sort_keys(draw(_key_orders))
    rows = draw(st.lists(_row, max_size=30))
    if draw(st.booleans()):
        rows.sort(key=functools.cmp_to_key(lambda a, b: _compare(a, b, order)))
    table = pa.Table.from_pylist(rows, SCHEMA)
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    bounds = [0, *cuts, len(rows)]
    return pa.concat_tables([table.slice(a, b - a) for a, b in pairwise(bounds)]
                            or [table]), order


@settings(max_examples=300, deadline=None)
@given(_tables())
def test_the_order_check_is_strict_increase_in_the_sorts_order(case):
    table, order = case
    rows = table.to_pylist()
    increasing = all(_compare(a, b, order) < 0 for a, b in pairwise(rows))
    assert row_order.in_sort_order(table, order) == increasing
    assert row_order.sorted_rows(table, order).equals(table.take(pc.sort_indices(table, order)))
    if increasing:  # what the skip stands for: the sort would leave the rows as they are
        assert pc.sort_indices(table, order).to_pylist() == list(range(table.num_rows))


def _file(path: str, stats: dict) -> DataFile:
    return DataFile(path, 1, 1, {}, stats)


def test_files_are_ordered_by_their_first_key_columns_bound():
    files = [_file("c", {("min", "k1"): 20, ("max", "k1"): 29}), _file("none", {}),
             _file("a", {("min", "k1"): 0, ("max", "k1"): 9}),
             _file("b2", {("min", "k1"): 10, ("max", "k1"): 15}),
             _file("b1", {("min", "k1"): 10, ("max", "k1"): 10})]
    up = KeyOrder((KeyColumn("k1", "bigint"), KeyColumn("k2", "string", True)))
    down = KeyOrder((KeyColumn("k1", "bigint", True),))
    assert [f.path for f in row_order.by_lower_key(files, up)] == ["a", "b1", "b2", "c", "none"]
    assert [f.path for f in row_order.by_lower_key(files, down)] == ["c", "b2", "b1", "a",
                                                                      "none"]


@st.composite
def _layouts(draw) -> dict:
    key_order = draw(_key_orders)
    clean = draw(st.booleans())  # no null, no repeated pk: a DV delete may be drawn
    rows = draw(st.lists(_row, min_size=8, max_size=40))
    if clean:  # one row per key (a key has one vnode), none null
        rows = list({tuple(r[c] for c in key_order.names): r for r in rows
                     if all(r[c] is not None for c in key_order.names)}.values())
    disjoint = draw(st.booleans())
    order = _sort_keys(key_order)
    files: list[list[dict]] = []
    on_first = draw(st.booleans())
    if disjoint:  # per vnode: sorted, cut in a few pieces
        for v in range(VNODES):
            mine = sorted((r for r in rows if r["vnode"] == v),
                          key=functools.cmp_to_key(lambda a, b: _compare(a, b, order)))
            # cut anywhere, or only where the first key column changes (``_first_column_cuts``)
            starts = [i for i in range(1, len(mine)) if not on_first
                      or mine[i - 1][key_order.names[0]] != mine[i][key_order.names[0]]]
            cuts = sorted(draw(st.sets(st.sampled_from(starts), max_size=3))) if starts else []
            bounds = [0, *cuts, len(mine)]
            files += [mine[a:b] for a, b in pairwise(bounds) if b > a]
    else:
        shuffled = draw(st.permutations(rows))
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(rows) - 1)), max_size=5)))
        bounds = [0, *(c for c in cuts if c < len(rows)), len(rows)]
        files = [shuffled[a:b] for a, b in pairwise(bounds) if b > a]
    return {"key_order": key_order, "rows": rows, "disjoint": disjoint, "clean": clean,
            "files": draw(st.permutations(files)),  # the log's order: any
            "stats": draw(st.one_of(st.just([True] * len(files)), st.lists(
                st.booleans(), min_size=len(files), max_size=len(files)))),
            "deleted": draw(st.sets(st.integers(0, max(0, len(rows) - 1)), max_size=5))
            if clean and rows else set(),
            "shuffle": draw(st.randoms(use_true_random=False)) if draw(st.booleans()) else None,
            "transform": draw(st.sampled_from([Positive(), Every()]))}


def _source(uri: str, layout: dict) -> TableVersion:
    """The layout's files committed one by one (a file without stats: its numRecords only),
    then the ``deleted`` rows deleted by DVs."""
    ensure_mor_table(uri, SCHEMA, None, cdf=False,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    for rows, stats in zip(layout["files"], layout["stats"], strict=True):
        written = write_table(pa.Table.from_pylist(rows, SCHEMA), uri, {}, SCHEMA)
        if not stats:
            written = [type(f)(f.path, f.size, f.rows, json.dumps({"numRecords": f.rows}))
                       for f in written]
        commit_written(TableVersion.load(uri), Intent(), BulkWritten(uri, {}, tuple(written)))
    gone = [layout["rows"][i] for i in sorted(layout["deleted"])]
    if gone:
        apply_keyed(TableVersion.load(uri), list(layout["key_order"].names), Intent(),
                    KeyedRows(pa.Table.from_pylist(gone, SCHEMA), SCHEMA.empty_table()))
    return TableVersion.load(uri)


def _run(snap: TableVersion, layout: dict, out: str) -> tuple[list, list, int]:
    """Each task run here: (the rows it wrote, file by file; its report), and how many sorts
    the tasks made."""
    rows = BulkRows(snap, tuple(range(VNODES)), tuple(SCHEMA.names), layout["transform"],
                    layout["key_order"])
    base = exchange_schema(SCHEMA)
    tasks = [json.loads(t) for t in whole_vnode_tasks(snap, rows.vnodes, rows.columns, base,
                                                      8, 2, rows.key_order)]
    if layout["shuffle"] is not None:  # any file order is read right
        for t in tasks:
            layout["shuffle"].shuffle(t["files"])
    sorts = 0
    real = pc.sort_indices

    def counted(*args, **kwargs):
        nonlocal sorts
        sorts += 1
        return real(*args, **kwargs)

    written, reports = [], []
    pc.sort_indices = counted
    try:
        for t in tasks:
            task = bulk._BulkTask(rows, FileWriter(out, {}, SCHEMA.serialize().to_pybytes(), "",
                                                   "part", 1000))
            for entry in task._task(t):
                row = entry.to_pylist()[0]
                if row["path"] is None:
                    report = json.loads(row["stats"])
                    report["vnodes"] = pickle.loads(base64.b64decode(report["vnodes"]))
                    reports.append(report)
                else:
                    written.append(pq.read_table(os.path.join(out, row["path"])))
    finally:
        pc.sort_indices = real
    return written, reports, sorts


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_layouts())
def test_a_task_writes_what_the_sort_would(tmp_path_factory, monkeypatch, layout):
    base = tmp_path_factory.mktemp("order")
    snap = _source(str(base / "src"), layout)
    got, got_reports, sorts = _run(snap, layout, str(base / "skip"))
    with monkeypatch.context() as m:  # the reference: every task sorts, as before the check
        m.setattr(bulk, "in_sort_order", lambda table, order: False)
        m.setattr(bulk, "sorted_rows", lambda table, order: table.take(
            pc.sort_indices(table, order)))
        want, want_reports, _ = _run(snap, layout, str(base / "sort"))
    assert got_reports == want_reports
    assert [t.to_pylist() for t in got] == [t.to_pylist() for t in want]
    order = _sort_keys(layout["key_order"])
    for table in got:
        rows = table.to_pylist()
        assert all(_compare(a, b, order) < 0 for a, b in pairwise(rows))
    event(f"sorted: {bool(sorts)}, disjoint: {layout['disjoint']}, "
          f"pk flagged: {any(s[2] for r in got_reports for s in r['vnodes'].values())}")
    if layout["disjoint"] and layout["clean"] and all(layout["stats"]) \
            and layout["shuffle"] is None and _first_column_cuts(layout):
        event("the writer's layout")
        assert sorts == 0  # no task sorted


def _first_column_cuts(layout: dict) -> bool:
    """Each vnode's files meet only where the first key column changes: their bounds on it
    alone order them."""
    first = layout["key_order"].names[0]
    spans: dict[int, list[tuple]] = {}
    for rows in layout["files"]:
        values = [r[first] for r in rows]
        spans.setdefault(rows[0]["vnode"], []).append((min(values), max(values)))
    return all(a[1] < b[0] or b[1] < a[0] for s in spans.values()
               for i, a in enumerate(s) for b in s[i + 1:])


def test_the_writers_layout_skips_the_sort(tmp_path):
    """Sorted, disjoint files per vnode listed newest first (the platform writer's appends):
    read in key order, no task sorts, and the files are those of the sort."""
    key_order = KeyOrder((KeyColumn("k1", "bigint"),))
    rows = [{"k1": k, "k2": "x", "qty": k % 3 - 1, "vnode": k % VNODES} for k in range(90)]
    files = [[r for r in rows if r["vnode"] == v and lo <= r["k1"] < lo + 30]
             for lo in (60, 30, 0) for v in range(VNODES)]
    layout = {"key_order": key_order, "rows": rows, "files": files, "stats": [True] * 12,
              "deleted": {4, 50}, "shuffle": None}
    snap = _source(str(tmp_path / "src"), layout)
    for transform in (Positive(), Every()):
        layout["transform"] = transform
        written, reports, sorts = _run(snap, layout, str(tmp_path / "out"))
        assert sorts == 0
        live = [r for r in rows if r["k1"] not in (4, 50)]
        kept = [r for r in live if transform.keeps_every_row or r["qty"] > 0]
        assert [r for t in written for r in t.to_pylist()] == sorted(
            kept, key=lambda r: (r["vnode"], r["k1"]))
        assert {v: s for rep in reports for v, s in rep["vnodes"].items()} == {
            v: (sum(r["vnode"] == v for r in live), (max(r["k1"] for r in live
                                                         if r["vnode"] == v),), False)
            for v in range(VNODES)}


@pytest.mark.parametrize("descending", [False, True])
def test_overlapping_files_are_sorted(tmp_path, descending):
    """Two files of one vnode whose key ranges interleave: the check fails, the task sorts."""
    key_order = KeyOrder((KeyColumn("k1", "bigint", descending),))
    rows = [{"k1": k, "k2": None, "qty": 1, "vnode": 0} for k in range(10)]
    layout = {"key_order": key_order, "rows": rows, "files": [rows[0::2], rows[1::2]],
              "stats": [True, True], "deleted": set(), "shuffle": None,
              "transform": Positive()}
    written, _, sorts = _run(_source(str(tmp_path / "src"), layout), layout,
                             str(tmp_path / "out"))
    assert sorts > 0
    assert [r["k1"] for t in written for r in t.to_pylist()] == sorted(range(10),
                                                                      reverse=descending)
