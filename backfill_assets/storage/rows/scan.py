"""Reading a Delta version into Spark, the protocol honoured, without Delta jars.

The driver plans from the log (``TableVersion``): which files, their typed partition values and
their deletion-vector descriptors. Spark tasks (``mapInArrow``) then read each file through the
store's pyarrow filesystem, check its row count against the log, drop the rows its DV deletes,
rename physical columns (column mapping) and add the partition values. Rows never pass through
the driver, and the same code reads a local folder, a cluster's shared store or an object
store. ``row_ids=True`` adds each row's file and physical row index: what a writer needs to
delete it with a DV.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from backfill_assets.core import names
from backfill_assets.core.errors import StorageMismatch
from backfill_assets.core.names import VNODE
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.delta.prune import vnode_span
from backfill_assets.storage.rows.spark_types import col, exchange_schema, spark_schema
from backfill_assets.storage.store import objects

FILE_COLUMN = names.FILE  # the file a row was read from (path as in the log)
ROW_COLUMN = names.ROW  # its physical row index in that file
MAX_READ_TASKS = 512
# rows a read task holds, about: a Python task's start costs more than reading a small file,
# so one task per small file (the many files of a vnode-partitioned writer) would read far
# slower than Spark's own parquet scan, while a few large tasks read faster than it
READ_TASK_ROWS = 1 << 20


def read_table_version(spark: SparkSession, snap: TableVersion,
                       columns: Sequence[str] | None = None,
                       files: Sequence[DataFile] | None = None, *, row_ids: bool = False,
                       cluster_keys: Sequence[str] | None = None) -> DataFrame:
    """The live rows of ``files`` (default: every file) of ``snap``, ``columns`` (default all).
    ``cluster_keys``: each Spark partition holds the files of one contiguous vnode range,
    its rows sorted by (vnode, *cluster_keys) (files of one vnode each, as in a
    vnode-partitioned table, then give partitions of disjoint vnode ranges in the MV's
    layout: a writer needs no shuffle). The sort is Spark's, inside each partition (no
    exchange): an Arrow sort in the read task costs more.
    Raises UnsupportedTableFeature for what the layer cannot honour, StorageMismatch (in the
    Spark job) when a file does not hold the rows its log entry records."""
    snap.check_readable()
    schema = snap.arrow_schema
    wanted = list(columns) if columns is not None else schema.names
    fields = [schema.field(c) for c in wanted]
    if row_ids:
        fields += [pa.field(FILE_COLUMN, pa.string()), pa.field(ROW_COLUMN, pa.int64())]
    out = exchange_schema(pa.schema(fields))
    chosen = list(snap.files if files is None else files)
    if not chosen:
        return spark.createDataFrame([], spark_schema(out))
    parts = [c for c in wanted if c in snap.partition_columns]
    entries = [{"path": f.path, "uri": snap.file_uri(f.path), "rows": f.num_records,
                "dv": f.deletion_vector, "parts": b64(partition_row(f, parts, out))}
               for f in chosen]
    physical = {c: snap.physical_names.get(c, c) for c in wanted if c not in parts}
    reader = _FileReader(snap.uri, dict(snap.storage_options), physical, out.serialize(),
                         row_ids)
    if cluster_keys is None:
        groups = pack(entries, parallelism(spark))
    else:
        order = sorted(range(len(chosen)), key=lambda i: vnode_span(chosen[i])[0] or -1)
        groups = pack_in_order([entries[i] for i in order], parallelism(spark))
    tasks = [json.dumps(t) for t in groups]
    rows = one_task_per_partition(spark, tasks).mapInArrow(reader, spark_schema(out))
    if cluster_keys is None:
        return rows
    return rows.sortWithinPartitions(*[col(c) for c in (VNODE, *cluster_keys)])


def pack(entries: list[dict], min_tasks: int) -> list[list[dict]]:
    """Files grouped into read tasks of about READ_TASK_ROWS rows (log counts), at least
    ``min_tasks`` of them when there are that many files: largest file first into the task
    holding the fewest rows (the fewest files on a tie, so files without rows never leave a
    task empty)."""
    count = _task_count(entries, sum(e["rows"] or 0 for e in entries), min_tasks)
    tasks: list[list[dict]] = [[] for _ in range(count)]
    held = [0] * count
    for e in sorted(entries, key=lambda e: -(e["rows"] or 0)):
        i = min(range(count), key=lambda t: (held[t], len(tasks[t])))
        tasks[i].append(e)
        held[i] += e["rows"] or 0
    return tasks


def pack_in_order(entries: list[dict], min_tasks: int) -> list[list[dict]]:
    """``pack`` keeping the files' order: consecutive runs of about equal rows."""
    total = sum(e["rows"] or 0 for e in entries)
    count = _task_count(entries, total, min_tasks)
    tasks: list[list[dict]] = [[]]
    held = 0
    for e in entries:
        if tasks[-1] and len(tasks) < count and held >= total * len(tasks) / count:
            tasks.append([])
        tasks[-1].append(e)
        held += e["rows"] or 0
    return tasks


def _task_count(entries: list[dict], total: int, min_tasks: int) -> int:
    return max(1, min(len(entries), MAX_READ_TASKS,
                      max(min_tasks, math.ceil(total / READ_TASK_ROWS))))


def parallelism(spark: SparkSession) -> int:
    """Tasks Spark runs at once, as configured (works on a Connect session too)."""
    try:
        return max(1, int(spark.conf.get("spark.default.parallelism", "4")))
    except Exception:  # noqa: BLE001 - an unset or unreadable conf: Spark's local default
        return 4


def tasks_run_here(spark: SparkSession) -> bool:
    """Whether Spark's tasks run on this machine, beside this process: a classic session on a
    local master. Its Python workers then compete for the same cores as threads here would,
    so work sized to a few tasks is cheaper run here than through a job, whose start and
    workers cost more than the same tasks on threads here. A Connect
    session (no SparkContext here) and a cluster run their tasks elsewhere. A lazy session
    not started yet (``resources.spark.LazySession``) says where it will run, so asking
    starts no JVM."""
    planned = getattr(spark, "planned_master", None)
    if planned is not None and not getattr(spark, "started", True):
        return str(planned).startswith("local")
    try:
        return str(spark.sparkContext.master).startswith("local")
    except Exception:  # noqa: BLE001 - a Connect session has no SparkContext
        return False


def one_task_per_partition(spark: SparkSession, tasks: list[str]) -> DataFrame:
    """A one-column (``task``) frame with each task in a Spark partition of its own: a range
    of one row per partition, each row's index mapped to its task. (A frame of the tasks
    dealt round-robin by ``repartition`` put two tasks in one partition and none in the
    other, for two and for four tasks: half the cores idle.)"""
    return spark.range(0, len(tasks), 1, max(1, len(tasks))).mapInArrow(
        _TaskOf(tasks), "task string")


class _TaskOf:
    """Picklable: a range row's index -> its task."""

    def __init__(self, tasks: list[str]):
        self.tasks = list(tasks)

    def __call__(self, batches):
        for batch in batches:
            yield pa.record_batch([pa.array([self.tasks[i] for i in batch.column(0).to_pylist()],
                                             pa.string())], names=["task"])


def b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def unb64_table(text: str | None) -> pa.Table | None:
    """A partition-values row written by ``partition_row`` and ``b64``."""
    return None if text is None else pa.ipc.open_stream(base64.b64decode(text)).read_all()


def partition_row(f: DataFile, parts: Sequence[str], out: pa.Schema) -> bytes | None:
    """A file's partition values as a one-row Arrow IPC table of the exact column types."""
    if not parts:
        return None
    return ipc_bytes(pa.table({c: pa.array([f.partition_values.get(c)]).cast(out.field(c).type)
                               for c in parts}))


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream (read back by ``unb64_table`` after ``b64``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


class _FileReader:
    """The task side (picklable): read, check, apply DV, rename, add partition values."""

    def __init__(self, table_uri: str, options: Mapping[str, str],
                 physical: Mapping[str, str], out_schema: pa.Buffer, row_ids: bool):
        self.table_uri, self.options, self.physical = table_uri, options, dict(physical)
        self.out_schema, self.row_ids = out_schema.to_pybytes(), row_ids

    def __call__(self, batches):
        out = pa.ipc.read_schema(pa.py_buffer(self.out_schema))
        for batch in batches:
            for text in batch.column(0).to_pylist():
                for f in json.loads(text):
                    yield from self._read(f, out).to_batches(max_chunksize=65536)

    def _read(self, f: dict, out: pa.Schema) -> pa.Table:
        deleted = dv.load(self.table_uri, f["dv"], self.options) if f["dv"] else None
        ids = f["path"] if self.row_ids else None
        return file_rows(f["uri"], self.options, self.physical, out, rows=f["rows"],
                         deleted=deleted, partition=unb64_table(f["parts"]), row_ids_for=ids)


def file_rows(uri: str, options: Mapping[str, str], physical: Mapping[str, str],
              out: pa.Schema, *, rows: int | None = None, deleted=None, only=None,
              partition: pa.Table | None = None, constants: Mapping[str, object] | None = None,
              row_ids_for: str | None = None) -> pa.Table:
    """The rows of one data file as ``out``: its physical row count checked against ``rows``
    (the log's), the rows of ``deleted`` dropped (or only those of ``only`` kept: the rows a
    new DV deletes), logical names for physical ones, partition values and ``constants``
    added."""
    fs, path = objects.filesystem(uri, options)
    with fs.open_input_file(path) as handle:
        pf, present = opened(handle, uri, rows)
        count = pf.metadata.num_rows
        table = pf.read(columns=[p for p in physical.values() if p in present])
    for bitmap in (deleted, only):
        if bitmap is not None and len(bitmap) and bitmap.max() >= count:
            raise StorageMismatch(f"a DV of {uri} names row {bitmap.max()} of {count}: the DV "
                                  "belongs to another file")
    extra = {name: pa.repeat(pa.scalar(value, out.field(name).type), count)
             for name, value in (constants or {}).items()}
    if row_ids_for is not None:
        extra[FILE_COLUMN] = pa.repeat(pa.scalar(row_ids_for), count)
        extra[ROW_COLUMN] = pa.array(range(count), pa.int64())
    result = shaped(table, present, physical, out, partition, extra)
    if only is not None:
        return result.filter(pc.invert(_mask(count, only)))
    if deleted is not None and len(deleted):
        return result.filter(_mask(count, deleted))
    return result


def file_row_groups(uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                    out: pa.Schema, *, rows: int | None = None,
                    partition: pa.Table | None = None) -> Iterator[tuple[int, pa.Table]]:
    """The rows of one data file a row group at a time, as ``file_rows`` (no DV applied):
    (the group's first physical row, its rows). A pass over a large file then holds one row
    group, not the file: a 100M-row MV's files hold about 2M rows each (merge.TARGET_FILES)."""
    fs, path = objects.filesystem(uri, options)
    with fs.open_input_file(path) as handle:
        pf, present = opened(handle, uri, rows)
        start = 0
        for i in range(pf.metadata.num_row_groups):
            group = pf.read_row_group(i, columns=[p for p in physical.values() if p in present])
            yield start, shaped(group, present, physical, out, partition)
            start += group.num_rows


def shaped(table: pa.Table, present: set[str], physical: Mapping[str, str], out: pa.Schema,
            partition: pa.Table | None, extra: Mapping[str, pa.Array] | None = None
            ) -> pa.Table:
    """Rows read from a file as ``out``: logical names for physical ones (a column the file
    lacks is null), partition values and ``extra`` columns added, types cast."""
    count = table.num_rows
    data = {logical: table.column(phys) if phys in present else pa.nulls(count)
            for logical, phys in physical.items()}
    for name in (partition.column_names if partition is not None else ()):
        data[name] = pa.repeat(partition.column(name)[0], count)
    data.update(extra or {})
    return pa.table({f.name: _cast(data[f.name], f.type) for f in out}, schema=out)


def opened(handle, uri: str, rows: int | None):
    """An open data file and its physical column names, its row count checked against the
    log's ``rows``."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(handle)
    count = pf.metadata.num_rows
    if rows is not None and count != rows:
        raise StorageMismatch(
            f"{uri} holds {count} rows but the Delta log records {rows}: the store is not "
            "what the log says; stop")
    return pf, set(pf.schema_arrow.names)


def _cast(col, t: pa.DataType):
    return col if col.type == t else col.cast(t)


def _mask(rows: int, deleted) -> pa.Array:
    """Keep-mask of ``rows`` rows with the DV's rows false."""
    import numpy as np

    keep = np.ones(rows, dtype=bool)
    keep[np.fromiter(deleted, dtype=np.int64, count=len(deleted))] = False
    return pa.array(keep)
