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
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.chunk_task import (
    BAD_KEY,
    RN,
    VNODE,
    ChunkReader,
    last_of_each_vnode,
    read_task_rows,
    take_chunk,
)
from backfill_assets.storage.chunks.row_order import by_lower_key
from backfill_assets.storage.chunks.seek import ChunkFiles
from backfill_assets.storage.chunks.shared_cut import SharedCut
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.delta.prune import files_in_vnodes, vnode_span
from backfill_assets.storage.rows import replica
from backfill_assets.storage.rows.scan import (
    READ_TASK_ROWS,
    b64,
    file_rows,
    ipc_bytes,
    one_task_per_partition,
    parallelism,
    partition_row,
)
from backfill_assets.storage.rows.spark_types import exchange_schema, spark_schema

__all__ = ["BAD_KEY", "RN", "ChunkReader", "last_of_each_vnode", "read_task_rows", "take_chunk"]
TASK_ROWS = 262144  # rows a task reads, about: a chunk of a few thousand rows is one task
MAX_TASKS = 64


def read_chunk(spark: SparkSession, snap: TableVersion, columns: Sequence[str], key_order: KeyOrder,
               positions: Mapping[int, Key | None], limit: int, picked: ChunkFiles,
               shared: bool, changes: pa.Table | None = None) -> DataFrame:
    """The chunk's candidate rows (``columns`` + RN + BAD_KEY), clustered by vnode range and
    sorted by (vnode, key) inside each Spark partition. ``changes``: the change rows of a
    replica (storage/rows/replica.py), resolved with its base rows in the tasks."""
    tasks, reader = chunk_tasks(snap, columns, key_order, positions, limit, picked, shared,
                                changes)
    if not tasks:
        return spark.createDataFrame([], spark_schema(reader.out_schema))
    return one_task_per_partition(spark, tasks).mapInArrow(reader,
                                                           spark_schema(reader.out_schema))


def chunk_tasks(snap: TableVersion, columns: Sequence[str], key_order: KeyOrder,
                positions: Mapping[int, Key | None], limit: int, picked: ChunkFiles,
                shared: bool, changes: pa.Table | None = None, slots: int | None = None,
                tail: int = 0, cut: SharedCut | None = None) -> tuple[list[str], ChunkReader]:
    """A chunk read's tasks (JSON) and the task side that reads one: see ``read_chunk``.
    ``slots``: the cores the tasks run on; tasks then hold at least the rows read / slots
    (a Python task that also writes costs a start of its own, and more tasks than cores
    only queue). ``tail``: rows beyond ``limit`` a vnode keeps when they are all it has left
    (``core.positions.keep_rows``; per-vnode reads only). ``cut``: a shared read whose cut
    the driver knows (storage/chunks/shared_cut.py): each vnode's rows up to it, nothing ranked
    across the tasks."""
    snap.check_readable()
    schema = snap.arrow_schema
    out = exchange_schema(pa.schema([schema.field(c) for c in columns]))
    out = out.append(pa.field(RN, pa.int64())).append(pa.field(BAD_KEY, pa.bool_()))
    read = [*columns, *((replica.VERSION, replica.DELETED) if changes is not None else ())]
    base = exchange_schema(pa.schema([schema.field(c) for c in read]))
    task_rows = TASK_ROWS if not slots else max(TASK_ROWS,
                                                math.ceil(picked.rows_scanned / slots))
    tasks = _tasks(snap, picked, [c for c in columns if c in snap.partition_columns], base,
                   task_rows=task_rows, changes=changes)
    physical = {c: snap.physical_names.get(c, c) for c in read
                if c not in snap.partition_columns}
    pos = {v: p for v, p in positions.items() if p is not None}
    reader = ChunkReader(snap.uri, dict(snap.storage_options), physical, out, key_order,
                          pos, limit, shared and cut is None, overlay=changes is not None,
                          tail=tail, ranged=cut is not None,
                          upper=None if cut is None else cut.key)
    return tasks, reader


def vnode_key_stats(spark: SparkSession, snap: TableVersion, key_order: KeyOrder,
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
    # key columns only: tasks of about 4M rows (each Python task costs a start of its own)
    tasks = whole_vnode_tasks(snap, positions, columns, out, 4 * READ_TASK_ROWS,
                              parallelism(spark))
    if not tasks:
        return {}
    physical = {c: snap.physical_names.get(c, c) for c in columns
                if c not in snap.partition_columns}
    pos = {v: p for v, p in positions.items() if p is not None}
    reader = ChunkReader(snap.uri, dict(snap.storage_options), physical, out, key_order, pos,
                          1 << 62, False, per_vnode=True)
    rows = one_task_per_partition(spark, tasks).mapInArrow(reader, spark_schema(out))
    stats = {}
    for r in rows.toArrow().to_pylist():
        stats[r[VNODE]] = (r[RN], tuple(r[k] for k in key_order.names), r[BAD_KEY])
    return stats


def whole_vnode_tasks(snap: TableVersion, vnodes: Iterable[int], columns: Sequence[str],
                      out: pa.Schema, task_rows: int, min_tasks: int,
                      key_order: KeyOrder | None = None) -> list[str]:
    """Tasks (JSON) reading every row of ``vnodes``: contiguous vnode ranges of about
    ``task_rows`` rows, each with the files meeting its vnodes. ``key_order``: each vnode's
    files in the order of their lower key bound (``row_order.by_lower_key``), so that sorted,
    disjoint files read in turn give rows a bulk task need not sort."""
    wanted = sorted(set(vnodes))
    chosen = set(wanted)
    by_vnode: dict[int, list[DataFile]] = {}
    for f in files_in_vnodes(snap.files, wanted):
        lo, hi = vnode_span(f)
        for v in range(lo if lo is not None else wanted[0],
                       (hi if hi is not None else wanted[-1]) + 1):
            if v in chosen:
                by_vnode.setdefault(v, []).append(f)
    if key_order is not None:
        by_vnode = {v: by_lower_key(files, key_order) for v, files in by_vnode.items()}
    picked = ChunkFiles({(v,): files for v, files in by_vnode.items()})
    return _tasks(snap, picked, [c for c in columns if c in snap.partition_columns], out,
                  task_rows=task_rows, min_tasks=min_tasks)


def _tasks(snap: TableVersion, picked: ChunkFiles, parts: list[str], out: pa.Schema,
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
    held = 0.0  # estimated rows of the ranges so far: range k closes near (k + 1) targets,
    # so the ranges come out about equal (closing a range only past 1.5 targets leaves a
    # short last range, and two cores then wait on two long ones)
    for v in sorted(per_vnode):
        if ranges[-1] and held + estimate[v] / 2 > target * len(ranges) \
                and len(ranges) < count:
            ranges.append([])
        ranges[-1].append(v)
        held += estimate[v]
    tasks = []
    for vnodes in ranges:
        # only the files meeting the task's vnodes (a no_shuffle group's list is the run's)
        files = {f.path: f for f in files_in_vnodes(
            list({f.path: f for v in vnodes for f in per_vnode[v]}.values()), vnodes)}
        entries = [_entry(snap, f, parts, out) for f in files.values()]
        task: dict = {"vnodes": vnodes, "files": entries,
                      "whole": [v for v in vnodes if (v,) in picked.whole]}
        if picked.lowers and all(len(g) == 1 for g in picked.groups):
            # each vnode's files in seek order, with their lower bounds: read one at a time
            task["order"] = b64(pickle.dumps({v: [(f.path, picked.lowers.get(f.path))
                                                  for f in per_vnode[v]] for v in vnodes}))
        if changes is not None:
            mine = replica.split_by_vnode(changes, [vnodes])[0]
            task["changes"] = b64(ipc_bytes(mine.select(out.names).cast(out)))
            if not entries and not mine.num_rows:
                continue
        elif not entries:
            continue
        tasks.append(json.dumps(task))
    return tasks


def _entry(snap: TableVersion, f: DataFile, parts: list[str], out: pa.Schema) -> dict:
    """A task's entry for one file (what ``chunk_task.file_table`` reads)."""
    return {"path": f.path, "uri": snap.file_uri(f.path), "rows": f.num_records,
            "dv": f.deletion_vector, "one": _one_vnode(f),
            "parts": b64(partition_row(f, parts, out))}


def file_reader(snap: TableVersion, columns: Sequence[str]) -> Callable[[DataFile], pa.Table]:
    """One file's live rows of ``columns``, as a chunk task reads them (exchange types, DVs
    applied, row count checked, partition values from the log): what a one-read shared cut
    holds (storage/chunks/shared_cut.py)."""
    schema = snap.arrow_schema
    base = exchange_schema(pa.schema([schema.field(c) for c in columns]))
    parts = [c for c in columns if c in snap.partition_columns]
    physical = {c: snap.physical_names.get(c, c) for c in columns if c not in parts}

    def read(f: DataFile) -> pa.Table:
        deleted = dv.load(snap.uri, f.deletion_vector, snap.storage_options) \
            if f.deletion_vector else None
        partition = pa.table({c: pa.array([f.partition_values.get(c)]).cast(base.field(c).type)
                              for c in parts}) if parts else None
        return file_rows(snap.file_uri(f.path), snap.storage_options, physical, base,
                         rows=f.num_records, deleted=deleted, partition=partition)

    return read


class HeldChunk:
    """The task side of a chunk the shared cut already holds (``SharedCut.held``): a task's
    vnodes' rows, sorted by (vnode, key) and ranked, as ``ChunkReader.read`` gives a ranged
    chunk (run in this process only: it holds the rows)."""

    def __init__(self, rows: pa.Table, key_order: KeyOrder):
        self.rows, self.key_order = rows, key_order

    def tasks(self, slots: int) -> list[str]:
        """The chunk's vnodes in ``slots`` contiguous ranges of about equal rows."""
        vnodes = self.rows.column(VNODE).to_numpy(zero_copy_only=False)
        if not len(vnodes):
            return []
        ranges: list[list[int]] = [[]]
        counts = np.bincount(vnodes - vnodes.min())
        target, held = len(vnodes) / max(1, slots), 0
        for offset in np.flatnonzero(counts):
            if ranges[-1] and held >= target * len(ranges) and len(ranges) < slots:
                ranges.append([])
            ranges[-1].append(int(offset + vnodes.min()))
            held += int(counts[offset])
        return [json.dumps({"vnodes": r}) for r in ranges]

    def read(self, task: dict) -> tuple[pa.Table, set[int]]:
        wanted = pa.array(task["vnodes"], self.rows.schema.field(VNODE).type)
        rows = self.rows.filter(pc.is_in(self.rows.column(VNODE), value_set=wanted))
        return take_chunk(rows, self.key_order, {}, 1 << 62, False), set()


def _one_vnode(f: DataFile) -> bool:
    lo, hi = vnode_span(f)
    return lo is not None and lo == hi
