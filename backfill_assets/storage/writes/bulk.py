"""A bulk step's rows read, transformed and written in one Python task: no row enters the JVM.

A snapshot-mode bulk step reads every row of its vnodes, projects them through the MV
definition and writes them. Through Spark that is two crossings between the JVM and Python
per row plus Spark's own row format in between, which made a bulk barrier cost about twice a
plain clustered refresh of the same rows. When the transform is exact in Arrow
(``arrow.expressions``: the MV definition compiled with Spark's semantics), each task here reads a
contiguous vnode range (DVs applied, partition values from the log, row counts checked:
``read.file_rows``), applies the transform, sorts its rows by (vnode, key) and writes them as
the MV's files with their statistics (``write.FileWriter``): Spark only schedules the tasks and
collects the manifest, or on a local master threads here run them. A task reads each vnode's
files in the order of their lower key bound, and skips the sort when its rows are already in
order (``chunks/row_order.py``).

The write is the first phase of a two-phase commit: each task also reports, per vnode it read,
the rows read, the last key in key order, whether a pk is null or repeated and whether the
vnode's rest was all read: the progress the MV commit carries, from the rows it already holds
(a separate pass over the keys would read every row a second time). The caller then
commits ``BulkWritten.files`` with that progress, or ``discard``s them.

A transform may refuse a batch (its ``refusal`` exception: a value whose Arrow result is not
proven equal to Spark's). The task then deletes the files it wrote and reports the refusal in
its manifest instead of failing the job; the driver deletes every file of the job and raises
``TransformRefused``, and the caller writes the same rows through Spark. Nothing a refused
job wrote is named by a commit.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.names import VNODE
from backfill_assets.storage.chunks.chunk_scan import (
    BAD_KEY,
    RN,
    last_of_each_vnode,
    read_task_rows,
    take_chunk,
    whole_vnode_tasks,
)
from backfill_assets.storage.chunks.chunk_task import ranked
from backfill_assets.storage.chunks.row_order import in_sort_order, sorted_rows
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.scan import (
    READ_TASK_ROWS,
    one_task_per_partition,
    parallelism,
    tasks_run_here,
)
from backfill_assets.storage.rows.spark_types import exchange_schema
from backfill_assets.storage.rows.write import MANIFEST, FileWriter, NewFile, check_written
from backfill_assets.storage.store import objects

LOCAL_READ_ROWS = 1 << 19  # a chunk read of at most this many rows runs in the driver
LOCAL_THREADS = 2
BULK_ROWS_HERE = 1 << 19  # rows a bulk task reads when it runs in a thread here
MAX_TASKS_HERE = 48  # thread tasks at most (each writes its own files; see planned_tasks)
_REPORT = pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                     ("stats", pa.string())])  # a MANIFEST row without a path: a task's report


class TransformRefused(Exception):
    """A bulk transform refused some rows: write them through Spark instead (nothing written)."""


class BulkTransform(Protocol):
    """What the bulk tasks run over their rows (picklable): Arrow table in, Arrow table out,
    keeping ``vnode`` and the key columns."""

    # every row in comes out, in the order it came: the tasks then sort the rows once, by
    # their key columns, before it (the replica's copy); False: they sort what it returns
    keeps_every_row: bool

    def __call__(self, rows: pa.Table) -> pa.Table: ...


@dataclass(frozen=True)
class BulkRows:
    """Every row of ``vnodes`` in ``snap`` (columns ``columns``, with ``vnode``), through
    ``transform`` (picklable; Arrow table in, Arrow table out, keeping ``vnode`` and the key
    columns), sorted by (vnode, key in ``key_order``). ``refusal``: the exception type by
    which the transform refuses rows."""

    snap: TableVersion
    vnodes: tuple[int, ...]
    columns: tuple[str, ...]
    transform: BulkTransform
    key_order: KeyOrder
    refusal: type[Exception] = TransformRefused


@dataclass(frozen=True)
class BulkWritten:
    """Files a bulk write left uncommitted, and per vnode read: (rows read, last key in key
    order, whether a pk was null or repeated). Commit them (``merge.commit_written``)
    or ``discard`` them."""

    table_uri: str
    storage_options: Mapping[str, str]
    files: tuple[NewFile, ...]
    vnode_stats: Mapping[int, tuple[int, Key, bool]] = field(default_factory=dict)
    exhausted: frozenset[int] = frozenset()  # vnodes whose whole rest the tasks read

    @property
    def bad_keys(self) -> bool:
        return any(bad for _, _, bad in self.vnode_stats.values())

    def discard(self) -> None:
        for f in self.files:
            objects.delete(objects.join(self.table_uri, f.path), self.storage_options)


def write_bulk(spark: SparkSession, rows: BulkRows, table_uri: str,
               storage_options: Mapping[str, str], schema: pa.Schema, *,
               max_rows_per_file: int, split_column: str | None = None,
               key_bounds: bool = False) -> BulkWritten:
    """Write ``rows`` as new (uncommitted) files of the table at ``table_uri`` (columns of
    ``schema``), each task's rows one vnode range in (vnode, key) order (``split_column``:
    files of one value of it each, as the replica's seek wants). A task whose rows hold a
    null or repeated pk writes nothing (``bad_keys``: the caller names the key). Raises
    TransformRefused (after deleting what the job wrote) when the transform refused any
    rows."""
    key_sort = [(c.name, "descending" if c.descending else "ascending")
                for c in rows.key_order.columns] if key_bounds else None
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                        "", "part", max_rows_per_file, split_column, key_sort)
    tasks, threads = planned_tasks(spark, rows)
    # tasks here keep the keys they write for this process's next lookups (``key_cache``)
    keep = threads and key_cache.CACHE.fits(rows.snap.live_rows)
    key_schema = pa.schema([schema.field(k) for k in rows.key_order.names]) if keep else None
    manifest = run_tasks(spark, tasks, _BulkTask(rows, writer, key_schema), threads)
    return _collected(manifest, table_uri, storage_options)


def planned_tasks(spark: SparkSession, rows: BulkRows) -> tuple[list[str], int | None]:
    """A bulk write's tasks and the threads that run them here (None: Spark tasks): threads
    when ``bulk_threads`` allows and the rows make at most ``MAX_TASKS_HERE`` of their
    smaller tasks (``BULK_ROWS_HERE``: the driver holds two at a time). More tasks than the
    writers aim for files (merge.TARGET_FILES) would pass the DV limit (maintain.MAX_DV_FILES:
    a 100M-row MV's slices in threads left 130 files, and a 599 MiB driver peak against 334):
    such a write keeps 1M-row Spark tasks."""
    threads = bulk_threads(spark)
    if threads:
        tasks = _tasks(spark, rows, threads)
        if len(tasks) <= MAX_TASKS_HERE:
            return tasks, threads
    return _tasks(spark, rows, None), None


def run_tasks(spark: SparkSession, tasks: list[str], task, threads: int | None) -> list:
    """``task``'s manifest rows over ``tasks``: in ``threads`` here, or (None) Spark tasks."""
    return _local_manifest(tasks, task, threads) if threads else _manifest(spark, tasks, task)


def bulk_threads(spark: SparkSession) -> int | None:
    """Threads of this process that may run a bulk write's tasks, or None: Spark tasks (a
    cluster, a Connect session). On a local master Spark's Python workers use the cores
    threads here would, and the job costs its own on top (the JVM spends CPU serving the
    workers), so a bulk barrier runs faster in threads here than as Spark tasks."""
    if not tasks_run_here(spark):
        return None
    return max(LOCAL_THREADS, min(parallelism(spark), os.cpu_count() or 1))


def write_chunk(spark: SparkSession, tasks: list[str], reader, transform: Callable,
                refusal: type[Exception], table_uri: str, storage_options: Mapping[str, str],
                schema: pa.Schema, *, max_rows_per_file: int, rows_read: int | None = None,
                threads: int | None = None) -> BulkWritten:
    """A chunked barrier's snapshot chunk (``chunks.chunk_scan.chunk_tasks``: the rows after each
    position, the first ``limit`` per vnode) through ``transform`` into new files of the
    table at ``table_uri``, as ``write_bulk`` does for whole vnodes; the stats are those of
    the chunk's rows (read, last key, pk flags). ``rows_read``: the rows of the files the
    tasks may read, which decide where they run (``local_threads``); ``threads``: run them in
    this process on that many (a reader holding its rows, ``chunks.chunk_scan.HeldChunk``)."""
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                        "", "part", max_rows_per_file)
    task = _ChunkTask(reader, transform, refusal, writer)
    threads = threads or local_threads(spark, rows_read)
    return _collected(run_tasks(spark, tasks, task, threads), table_uri, storage_options)


def local_threads(spark: SparkSession, rows_read: int | None) -> int | None:
    """How many threads of this process run a chunk read of ``rows_read`` rows, or None: in
    Spark tasks. At most ``LOCAL_READ_ROWS`` run here (no session is started for them), and
    so does any chunk on a local master, one thread per core Spark would use
    (``read.tasks_run_here``): a chunk is sized to a few tasks, and a job costs more than
    its tasks' threads here."""
    if rows_read is None:
        return None
    if rows_read <= LOCAL_READ_ROWS:
        return LOCAL_THREADS
    return max(LOCAL_THREADS, parallelism(spark)) if tasks_run_here(spark) else None


def _manifest(spark: SparkSession, tasks: list[str], task) -> list:
    return one_task_per_partition(spark, tasks).mapInArrow(
        task, MANIFEST).collect() if tasks else []


def _local_manifest(tasks: list[str], task, threads: int = LOCAL_THREADS) -> list[dict]:
    """The tasks run here, ``threads`` at a time (parquet and Arrow release the GIL): a Spark
    job's start and its Python workers cost more than reading the last few
    thousand rows of each vnode takes (a run's final barrier, a throttled run's chunks)."""
    def run(text: str) -> list[dict]:
        batch = pa.record_batch([pa.array([text], pa.string())], names=["task"])
        return [row for out in task(iter([batch])) for row in out.to_pylist()]

    with ThreadPoolExecutor(max(1, min(threads, len(tasks), os.cpu_count() or 1))) as pool:
        return [row for rows in pool.map(run, tasks) for row in rows]


def _collected(manifest: list, table_uri: str,
               storage_options: Mapping[str, str]) -> BulkWritten:
    """The files and per-vnode stats the tasks reported; TransformRefused (after deleting
    the files) when a task refused."""
    written = BulkWritten(table_uri, dict(storage_options), tuple(
        NewFile.of(r) for r in manifest if r["path"] is not None))
    reports = [json.loads(r["stats"]) for r in manifest if r["path"] is None]
    refused = [r["refused"] for r in reports if "refused" in r]
    if refused:
        written.discard()
        raise TransformRefused(refused[0])
    stats: dict[int, tuple[int, Key, bool]] = {}
    exhausted: set[int] = set()
    for r in reports:
        if "vnodes" in r:
            stats.update(pickle.loads(base64.b64decode(r["vnodes"])))
            exhausted.update(r.get("exhausted", ()))
    check_written(table_uri, storage_options, list(written.files))
    return BulkWritten(table_uri, dict(storage_options), written.files, stats,
                       frozenset(exhausted))


def _tasks(spark: SparkSession, rows: BulkRows, threads: int | None) -> list[str]:
    """The tasks' JSON: of ``READ_TASK_ROWS`` rows read, ``BULK_ROWS_HERE`` in threads."""
    snap = rows.snap
    snap.check_readable()
    base = exchange_schema(pa.schema([snap.arrow_schema.field(c) for c in rows.columns]))
    task_rows = BULK_ROWS_HERE if threads else READ_TASK_ROWS
    return whole_vnode_tasks(snap, rows.vnodes, rows.columns, base, task_rows,
                             threads or parallelism(spark), rows.key_order)


class _BulkTask:
    """The task side (picklable): read the task's vnode range, report its vnodes' stats,
    transform, sort, write the files (``writer`` yields their manifest rows). ``kept_keys``:
    the key columns' schema in the table, when a task (run in a thread here) hands the keys
    it wrote to this process's key cache."""

    kept_keys: pa.Schema | None = None

    def __init__(self, rows: BulkRows, writer: FileWriter, kept_keys: pa.Schema | None = None):
        snap = rows.snap
        self.table_uri, self.options = snap.uri, dict(snap.storage_options)
        schema = snap.arrow_schema
        self.base = exchange_schema(pa.schema([schema.field(c) for c in rows.columns]))
        self.physical = {c: snap.physical_names.get(c, c) for c in rows.columns
                         if c not in snap.partition_columns}
        self.transform, self.refusal = rows.transform, rows.refusal
        self.key_order = rows.key_order
        self.order = [(VNODE, "ascending", "at_end")] + [
            (c.name, "descending" if c.descending else "ascending", "at_end")
            for c in rows.key_order.columns]
        self.writer, self.kept_keys = writer, kept_keys

    def __call__(self, batches):
        for batch in batches:
            for text in batch.column(0).to_pylist():
                yield from self._task(json.loads(text))

    def _task(self, task: dict):
        rows, stats, ordered, exhausted = self._rows(task)
        report = {"vnodes": _pickled(stats), "exhausted": sorted(exhausted)}
        if not any(bad for _, _, bad in stats.values()):
            written: list[tuple[str, int, int]] = []  # path, size, rows
            try:
                rows = self.transform(rows)
                rows = rows if ordered else sorted_rows(rows, self.order)
                for entry in self.writer(iter(rows.to_batches(max_chunksize=1 << 17))):
                    written.append(tuple(entry.column(i)[0].as_py() for i in range(3)))
                    yield entry
            except self.refusal as refused:
                for path, _, _ in written:
                    objects.delete(objects.join(self.writer.table_uri, path),
                                   self.writer.options)
                yield _report({"refused": str(refused)})
                return
            if self.kept_keys is not None:
                key_cache.CACHE.remember_written(self.writer.table_uri, written, rows.select(
                    self.kept_keys.names).cast(self.kept_keys))
        yield _report(report)

    def _rows(self, task: dict) -> tuple[pa.Table, dict, bool, set[int]]:
        """The task's rows, its vnodes' stats (from the key columns alone), whether the rows
        are in (vnode, key) order, and the vnodes read to their end (all). A transform that
        keeps every row (the replica's copy) gets them sorted once; others are sorted after
        the transform's filter (half of them in the benchmark's MV): taking every column
        costs most. Keys already strictly in order are neither sorted nor taken."""
        table = read_task_rows(self.table_uri, self.options, self.physical, self.base, task)
        keys = table.select([VNODE, *self.key_order.names])
        ordered = in_sort_order(keys, self.order)
        if self.transform.keeps_every_row:
            if not ordered:
                order = pc.sort_indices(keys, self.order)
                table, keys = table.take(order), keys.take(order)
            return table, _stats(ranked(keys, self.key_order), self.key_order), True, \
                set(task["vnodes"])
        chunk = ranked(keys, self.key_order) if ordered else \
            take_chunk(keys, self.key_order, {}, 1 << 62, False)
        # the transform's output is checked again (``sorted_rows``): its filter keeps the
        # order, but nothing here relies on that
        return table, _stats(chunk, self.key_order), False, set(task["vnodes"])


class _ChunkTask(_BulkTask):
    """A chunked barrier's task: the chunk read (``chunk_task.ChunkReader.read``: sorted,
    cut, ranked) is already in (vnode, key) order, and the transform keeps it."""

    def __init__(self, reader, transform: Callable, refusal: type[Exception],
                 writer: FileWriter):
        self.reader, self.transform, self.refusal, self.writer = reader, transform, refusal, writer
        self.key_order = reader.key_order

    def _rows(self, task: dict) -> tuple[pa.Table, dict, bool, set[int]]:
        chunk, exhausted = self.reader.read(task)
        return chunk.drop_columns([RN, BAD_KEY]), _stats(chunk, self.key_order), True, exhausted


def _pickled(stats: dict) -> str:
    return base64.b64encode(pickle.dumps(stats)).decode("ascii")


def _stats(ranked: pa.Table, key_order: KeyOrder) -> dict[int, tuple[int, Key, bool]]:
    """Per vnode of a ranked chunk: (rows, last key, any pk null or repeated)."""
    names = key_order.names
    return {r[VNODE]: (r[RN], tuple(r[k] for k in names), r[BAD_KEY])
            for r in last_of_each_vnode(ranked).to_pylist()}


def _report(report: dict) -> pa.RecordBatch:
    """A manifest row without a path: what the task found (its vnodes' stats, a refusal)."""
    return pa.RecordBatch.from_pylist(
        [{"path": None, "size": 0, "rows": 0, "stats": json.dumps(report)}], _REPORT)
