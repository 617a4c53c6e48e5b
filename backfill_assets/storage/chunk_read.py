"""A snapshot chunk read in one pass: the files ``seek.chunk_files`` picked, chunked in the
read tasks themselves.

Each Spark task holds a contiguous range of the chunk's vnodes and every file any of them
needs (a file spanning several tasks' vnodes is read by each, keeping only its own vnodes). It
reads them (DVs applied, row counts checked: ``read.file_rows``), keeps the keys after the
position, sorts by (vnode, key) in Arrow and keeps the first ``limit`` rows per vnode (or, in
no_shuffle, the first ``limit`` of the task across its vnodes: the step then cuts the run's
``limit`` from at most the rows read). The output is what the storage writer wants: each task
one vnode range in (vnode, key) order, so the MV write needs no shuffle (``apply_changes``
with ``clustered_inserts``). Spark sorts nothing: only the rows read are sorted, in the task.

Columns added: ``RN``, the row's rank inside its vnode (the last row of a vnode is its new
position), and ``BAD_KEY``, true for a null pk or a pk equal to the previous row's (the chunk's
own duplicate check, as in the window the step used before).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from backfill_assets.core import names
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage import dv, replica
from backfill_assets.storage.log import DataFile, Snapshot
from backfill_assets.storage.prune import files_in_vnodes, vnode_span
from backfill_assets.storage.read import (
    READ_TASK_ROWS,
    b64,
    file_rows,
    ipc_bytes,
    one_task_per_partition,
    parallelism,
    partition_row,
    unb64_table,
)
from backfill_assets.storage.seek import ChunkFiles
from backfill_assets.storage.spark_types import exchange_schema, spark_schema

RN, BAD_KEY, VNODE = names.ROW_NUMBER, names.BAD_KEY, "vnode"
TASK_ROWS = 262144  # rows a task reads, about: a chunk of a few thousand rows is one task
MAX_TASKS = 64


def read_chunk(spark: SparkSession, snap: Snapshot, columns: Sequence[str], key_order: KeyOrder,
               positions: Mapping[int, Key | None], limit: int, picked: ChunkFiles,
               shared: bool, changes: pa.Table | None = None) -> DataFrame:
    """The chunk's candidate rows (``columns`` + RN + BAD_KEY), clustered by vnode range and
    sorted by (vnode, key) inside each Spark partition. ``changes``: the change rows of a
    replica (storage/replica.py), resolved with its base rows in the tasks."""
    tasks, reader = chunk_tasks(snap, columns, key_order, positions, limit, picked, shared,
                                changes)
    if not tasks:
        return spark.createDataFrame([], spark_schema(reader.out_schema))
    return one_task_per_partition(spark, tasks).mapInArrow(reader,
                                                           spark_schema(reader.out_schema))


def chunk_tasks(snap: Snapshot, columns: Sequence[str], key_order: KeyOrder,
                positions: Mapping[int, Key | None], limit: int, picked: ChunkFiles,
                shared: bool, changes: pa.Table | None = None) -> tuple[list[str], _ChunkReader]:
    """A chunk read's tasks (JSON) and the task side that reads one: see ``read_chunk``."""
    snap.check_readable()
    schema = snap.arrow_schema
    out = exchange_schema(pa.schema([schema.field(c) for c in columns]))
    out = out.append(pa.field(RN, pa.int64())).append(pa.field(BAD_KEY, pa.bool_()))
    read = [*columns, *((replica.VERSION, replica.DELETED) if changes is not None else ())]
    base = exchange_schema(pa.schema([schema.field(c) for c in read]))
    tasks = _tasks(snap, picked, [c for c in columns if c in snap.partition_columns], base,
                   changes=changes)
    physical = {c: snap.physical_names.get(c, c) for c in read
                if c not in snap.partition_columns}
    pos = {v: p for v, p in positions.items() if p is not None}
    reader = _ChunkReader(snap.uri, dict(snap.storage_options), physical, out, key_order,
                          pos, limit, shared, overlay=changes is not None)
    return tasks, reader


def vnode_key_stats(spark: SparkSession, snap: Snapshot, key_order: KeyOrder,
                    positions: Mapping[int, Key | None]) -> dict[int, tuple[int, Key, bool]]:
    """Per vnode of ``positions`` that has rows after its position: (rows, last key in key
    order, whether a pk is null or repeated), for a table whose files each hold one vnode's
    rows (a vnode-partitioned platform table). Each task reads only the key columns of a
    contiguous vnode range, sorts them and sends one row per vnode to the driver: what a
    bulk read needs to know of the rows it writes, without a second pass over them in Spark."""
    columns = [*key_order.names, VNODE]
    schema = snap.arrow_schema
    base = exchange_schema(pa.schema([schema.field(c) for c in columns]))
    out = base.append(pa.field(RN, pa.int64())).append(pa.field(BAD_KEY, pa.bool_()))
    # key columns only: tasks of ~4M rows (a Python task costs ~50 ms to start)
    tasks = whole_vnode_tasks(snap, positions, columns, out, 4 * READ_TASK_ROWS,
                              parallelism(spark))
    if not tasks:
        return {}
    physical = {c: snap.physical_names.get(c, c) for c in columns
                if c not in snap.partition_columns}
    pos = {v: p for v, p in positions.items() if p is not None}
    reader = _ChunkReader(snap.uri, dict(snap.storage_options), physical, out, key_order, pos,
                          1 << 62, False, per_vnode=True)
    rows = one_task_per_partition(spark, tasks).mapInArrow(reader, spark_schema(out))
    stats = {}
    for r in rows.toArrow().to_pylist():
        stats[r[VNODE]] = (r[RN], tuple(r[k] for k in key_order.names), r[BAD_KEY])
    return stats


def whole_vnode_tasks(snap: Snapshot, vnodes: Iterable[int], columns: Sequence[str],
                      out: pa.Schema, task_rows: int, min_tasks: int) -> list[str]:
    """Tasks (JSON) reading every row of ``vnodes``: contiguous vnode ranges of about
    ``task_rows`` rows, each with the files meeting its vnodes."""
    wanted = sorted(set(vnodes))
    chosen = set(wanted)
    by_vnode: dict[int, list[DataFile]] = {}
    for f in files_in_vnodes(snap.files, wanted):
        lo, hi = vnode_span(f)
        for v in range(lo if lo is not None else wanted[0],
                       (hi if hi is not None else wanted[-1]) + 1):
            if v in chosen:
                by_vnode.setdefault(v, []).append(f)
    picked = ChunkFiles({(v,): files for v, files in by_vnode.items()})
    return _tasks(snap, picked, [c for c in columns if c in snap.partition_columns], out,
                  task_rows=task_rows, min_tasks=min_tasks)


def _tasks(snap: Snapshot, picked: ChunkFiles, parts: list[str], out: pa.Schema,
           task_rows: int = TASK_ROWS, min_tasks: int = 1,
           changes: pa.Table | None = None) -> list[str]:
    """Contiguous vnode ranges of about ``task_rows`` rows read (at least ``min_tasks`` of
    them when there are that many vnodes), each with its files and (a replica's) its
    vnodes' change rows (JSON): a vnode with change rows and no file is still read."""
    per_vnode: dict[int, list[DataFile]] = {}
    estimate: dict[int, float] = {}
    for group, files in picked.groups.items():
        for v in group:
            per_vnode[v] = files
            estimate[v] = sum(f.live_records or 0 for f in files) / len(group)
    if not per_vnode:
        return []
    total = max(1, picked.rows_scanned)
    count = max(1, min(MAX_TASKS, len(per_vnode),
                       max(min_tasks, math.ceil(total / task_rows))))
    target = total / count
    ranges: list[list[int]] = [[]]
    held = 0
    for v in sorted(per_vnode):
        if ranges[-1] and held + estimate[v] > target * 1.5 and len(ranges) < count:
            ranges.append([])
            held = 0
        ranges[-1].append(v)
        held += estimate[v]
    tasks = []
    for vnodes in ranges:
        # only the files meeting the task's vnodes (a no_shuffle group's list is the run's)
        files = {f.path: f for f in files_in_vnodes(
            list({f.path: f for v in vnodes for f in per_vnode[v]}.values()), vnodes)}
        entries = [{"path": f.path, "uri": snap.file_uri(f.path), "rows": f.num_records,
                    "dv": f.deletion_vector,
                    "parts": b64(partition_row(f, parts, out))} for f in files.values()]
        task: dict = {"vnodes": vnodes, "files": entries}
        if changes is not None:
            mine = replica.split_by_vnode(changes, [vnodes])[0]
            task["changes"] = b64(ipc_bytes(mine.select(out.names).cast(out)))
            if not entries and not mine.num_rows:
                continue
        elif not entries:
            continue
        tasks.append(json.dumps(task))
    return tasks


class _ChunkReader:
    """The task side (picklable): read the task's files, keep its chunk, sorted."""

    def __init__(self, table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                 out: pa.Schema, key_order: KeyOrder, positions: Mapping[int, Key], limit: int,
                 shared: bool, per_vnode: bool = False, overlay: bool = False):
        self.table_uri, self.options, self.physical = table_uri, dict(options), dict(physical)
        self.out = out.serialize().to_pybytes()
        self.key_order, self.positions, self.limit = key_order, dict(positions), limit
        self.shared, self.per_vnode, self.overlay = shared, per_vnode, overlay

    @property
    def out_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.out))

    def __call__(self, batches):
        out = self.out_schema
        for batch in batches:
            for text in batch.column(0).to_pylist():
                chunk = self.chunk(json.loads(text))
                if self.per_vnode:
                    chunk = last_of_each_vnode(chunk)
                yield from chunk.cast(out).to_batches(max_chunksize=65536)

    def chunk(self, task: dict) -> pa.Table:
        """One task's chunk: its rows after each position, the first ``limit``, ranked."""
        table = self._read(task)
        return take_chunk(table, self.key_order, self.positions, self.limit, self.shared)

    def _read(self, task: dict) -> pa.Table:
        """The task's rows (a replica's resolved with its change rows: storage/replica.py)."""
        out = self.out_schema
        base = pa.schema([f for f in out if f.name not in (RN, BAD_KEY)])
        if not self.overlay:
            return read_task_rows(self.table_uri, self.options, self.physical, base, task)
        lsm = base.append(pa.field(replica.VERSION, pa.int64())).append(
            pa.field(replica.DELETED, pa.bool_()))
        rows = read_task_rows(self.table_uri, self.options, self.physical, lsm, task)
        changes = unb64_table(task.get("changes"))
        if changes is not None and changes.num_rows:
            rows = pa.concat_tables([rows, changes.cast(lsm)])
        return replica.resolve(rows, self.key_order).select(base.names)


def read_task_rows(table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                   base: pa.Schema, task: dict) -> pa.Table:
    """The rows of a task's vnodes (``base`` columns) in its files: DVs applied, row counts
    checked, partition values from the log; rows of other vnodes in those files dropped."""
    wanted = pa.array(task["vnodes"], base.field(VNODE).type)
    tables = []
    for f in task["files"]:
        deleted = dv.load(table_uri, f["dv"], options) if f["dv"] else None
        rows = file_rows(f["uri"], options, physical, base, rows=f["rows"], deleted=deleted,
                         partition=unb64_table(f["parts"]))
        tables.append(rows.filter(pc.is_in(rows.column(VNODE), value_set=wanted)))
    return pa.concat_tables(tables) if tables else base.empty_table()


def take_chunk(table: pa.Table, key_order: KeyOrder, positions: Mapping[int, Key],
               limit: int, shared: bool) -> pa.Table:
    """The rows after each vnode's position (no position: all), the first ``limit`` per vnode
    (``shared``: of the whole table) in key order; sorted by (vnode, key), with RN and
    BAD_KEY."""
    keys = [(c.name, "descending" if c.descending else "ascending", "at_end")
            for c in key_order.columns]
    if shared:
        pos = next(iter(positions.values()), None)
        if pos is not None:
            table = table.filter(after(table, key_order, pos))
        table = table.take(pc.sort_indices(table, keys)[:limit])
    table = table.take(pc.sort_indices(table, [(VNODE, "ascending", "at_end"), *keys]))
    vnodes = table.column(VNODE).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, vnodes[1:] != vnodes[:-1]]) if len(vnodes) else []
    pieces = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(vnodes)
        piece = table.slice(start, stop - start)
        pos = None if shared else positions.get(int(vnodes[start]))
        if pos is not None:
            piece = piece.filter(after(piece, key_order, pos))
        pieces.append(piece if shared else piece.slice(0, limit))
    table = pa.concat_tables(pieces) if pieces else table
    return _ranked(table, key_order)


def last_of_each_vnode(chunk: pa.Table) -> pa.Table:
    """One row per vnode of a ranked chunk: its last row (RN = the vnode's rows), BAD_KEY set
    when any of its rows was flagged."""
    n = chunk.num_rows
    if not n:
        return chunk
    vnodes = chunk.column(VNODE).to_numpy(zero_copy_only=False)
    last = np.flatnonzero(np.r_[vnodes[1:] != vnodes[:-1], True])
    bad = chunk.column(BAD_KEY).to_numpy(zero_copy_only=False).astype(np.int64)
    bad_before = np.r_[0, np.cumsum(bad)]  # flagged rows before each index
    first = np.r_[0, last[:-1] + 1]
    any_bad = (bad_before[last + 1] - bad_before[first]) > 0
    out = chunk.take(pa.array(last))
    return out.set_column(out.schema.get_field_index(BAD_KEY), BAD_KEY, pa.array(any_bad))


def after(table: pa.Table, key_order: KeyOrder, pos: Key) -> pa.ChunkedArray:
    """Mask: the row's key sorts strictly after ``pos`` (null keys: null, i.e. dropped, as in
    the SQL of ``KeyOrder.sql_after``)."""
    expr = None
    for col, value in reversed(list(zip(key_order.columns, pos, strict=True))):
        column = table.column(col.name)
        scalar = pa.scalar(value, column.type)
        beyond = (pc.less if col.descending else pc.greater)(column, scalar)
        expr = beyond if expr is None else pc.or_kleene(
            beyond, pc.and_kleene(pc.equal(column, scalar), expr))
    return expr


def _ranked(table: pa.Table, key_order: KeyOrder) -> pa.Table:
    """Add RN (rank inside the vnode) and BAD_KEY to rows sorted by (vnode, key)."""
    n = table.num_rows
    vnodes = table.column(VNODE).to_numpy(zero_copy_only=False)
    new_run = np.r_[True, vnodes[1:] != vnodes[:-1]] if n else np.zeros(0, bool)
    index = np.arange(n)
    run_start = np.maximum.accumulate(np.where(new_run, index, 0)) if n else index
    rank = index - run_start + 1
    bad = np.zeros(n, bool)
    same = ~new_run.copy()
    for name in key_order.names:
        column = table.column(name)
        bad |= column.is_null().to_numpy(zero_copy_only=False)
        if n > 1:
            eq = pc.fill_null(pc.equal(column.slice(1), column.slice(0, n - 1)), False)
            same[1:] &= eq.to_numpy(zero_copy_only=False)
    bad |= same
    return table.append_column(RN, pa.array(rank, pa.int64())).append_column(
        BAD_KEY, pa.array(bad))
