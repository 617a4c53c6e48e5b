"""A bulk step's rows read, transformed and written in one Python task: no row enters the JVM.

A snapshot-mode bulk step reads every row of its vnodes, projects them through the MV
definition and writes them. Through Spark that is two crossings between the JVM and Python
per row (the layer's read tasks hand Arrow to the JVM, the JVM hands the projected rows back
to the write tasks) plus Spark's own row format in between: round 8 measured the bulk barrier
at 1.8-2.2x a clustered refresh. When the caller has a transform that is exact in Arrow
(``arrow_expr``: the MV definition compiled with Spark's semantics), each task here reads a
contiguous vnode range (DVs applied, partition values from the log, row counts checked:
``read.file_rows``), applies the transform, sorts its rows by (vnode, key) and writes them
as the MV's files with their statistics (``write.FileWriter``): Spark only schedules the
tasks and collects the manifest.

A transform may refuse a batch (its ``refusal`` exception: a value whose Arrow result is not
proven equal to Spark's). The task then deletes the files it wrote and reports the refusal in
its manifest instead of failing the job; the driver deletes every file of the job and raises
``TransformRefused``, and the caller writes the same rows through Spark. Nothing a refused
job wrote is named by a commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets.storage import objects
from backfill_assets.storage.chunk_read import read_task_rows, whole_vnode_tasks
from backfill_assets.storage.log import Snapshot
from backfill_assets.storage.read import READ_TASK_ROWS, one_task_per_partition, parallelism
from backfill_assets.storage.spark_types import exchange_schema
from backfill_assets.storage.write import MANIFEST, FileWriter, NewFile, check_written

VNODE = "vnode"
_REFUSAL = pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                      ("stats", pa.string())])  # a MANIFEST row (path null: the refusal)


class TransformRefused(Exception):
    """A bulk transform refused some rows: write them through Spark instead (nothing written)."""


@dataclass(frozen=True)
class BulkRows:
    """Every row of ``vnodes`` in ``snap`` (columns ``columns``, with ``vnode``), through
    ``transform`` (picklable; Arrow table in, Arrow table out) and sorted by (vnode,
    *``sort_keys``). ``refusal``: the exception type by which the transform refuses rows."""

    snap: Snapshot
    vnodes: tuple[int, ...]
    columns: tuple[str, ...]
    transform: Callable[[pa.Table], pa.Table]
    sort_keys: tuple[str, ...]
    refusal: type[Exception] = TransformRefused


def write_bulk(spark: SparkSession, rows: BulkRows, table_uri: str,
               storage_options: Mapping[str, str], schema: pa.Schema, *,
               max_rows_per_file: int) -> list[NewFile]:
    """Write ``rows`` as new files of the table at ``table_uri`` (columns of ``schema``), each
    task's rows one vnode range in (vnode, key) order. Raises TransformRefused (after
    deleting what the job wrote) when the transform refused any rows."""
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                         "", "part", max_rows_per_file)
    tasks = _tasks(spark, rows)
    if not tasks:
        return []
    manifest = one_task_per_partition(spark, tasks).mapInArrow(
        _BulkTask(rows, writer), MANIFEST).collect()
    files = [NewFile(r["path"], r["size"], r["rows"], r["stats"]) for r in manifest
             if r["path"] is not None]
    refused = [r["stats"] for r in manifest if r["path"] is None]
    if refused:
        for f in files:
            objects.delete(objects.join(table_uri, f.path), storage_options)
        raise TransformRefused(refused[0])
    check_written(table_uri, storage_options, files)
    return files


def _tasks(spark: SparkSession, rows: BulkRows) -> list[str]:
    snap = rows.snap
    snap.check_readable()
    base = exchange_schema(pa.schema([snap.arrow_schema.field(c) for c in rows.columns]))
    return whole_vnode_tasks(snap, rows.vnodes, rows.columns, base, READ_TASK_ROWS,
                             parallelism(spark))


class _BulkTask:
    """The task side (picklable): read the task's vnode range, transform, sort, write the
    files (``writer`` yields their manifest rows)."""

    def __init__(self, rows: BulkRows, writer: FileWriter):
        snap = rows.snap
        self.table_uri, self.options = snap.uri, dict(snap.storage_options)
        schema = snap.arrow_schema
        self.base = exchange_schema(pa.schema([schema.field(c) for c in rows.columns]))
        self.physical = {c: snap.physical_names.get(c, c) for c in rows.columns
                         if c not in snap.partition_columns}
        self.transform, self.refusal = rows.transform, rows.refusal
        self.order = [(c, "ascending", "at_start") for c in (VNODE, *rows.sort_keys)]
        self.writer = writer

    def __call__(self, batches):
        for batch in batches:
            for text in batch.column(0).to_pylist():
                yield from self._task(json.loads(text))

    def _task(self, task: dict):
        written: list[str] = []
        try:
            table = self.transform(self._read(task))
            table = table.take(pc.sort_indices(table, self.order))
            for entry in self.writer(iter(table.to_batches(max_chunksize=1 << 17))):
                written.append(entry.column(0)[0].as_py())
                yield entry
        except self.refusal as refused:
            for path in written:
                objects.delete(objects.join(self.writer.table_uri, path), self.writer.options)
            yield pa.RecordBatch.from_pylist(
                [{"path": None, "size": 0, "rows": 0, "stats": str(refused)}], _REFUSAL)

    def _read(self, task: dict) -> pa.Table:
        return read_task_rows(self.table_uri, self.options, self.physical, self.base, task)

