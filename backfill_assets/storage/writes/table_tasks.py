"""A table version's rows read by tasks of this process, and sorted rows written as a table's
new files: the two ends of a bulk whose middle is not a projection (``bulk.write_bulk``'s
transform) but the caller's own work, such as the join MV's bulk (join/bulk_tasks.py: a
lookup join, partial aggregates, index rows that change vnode, so pass between tasks).

Why not ``write_bulk``: its task reads, transforms and writes one vnode range of one table;
a join's index rows are hashed by the join key, not by the vnode the fact was read under, so
every read task holds rows of every index vnode and the writes must wait for all reads. The
reads here are the row MV bulk's (DVs applied, column mapping, partition values, row counts
checked: ``chunk_task.read_task_rows``); the writes are ``FileWriter``'s files with their
statistics, in the table's row groups (``backfill.rowGroupRows``), committed by
``commit_written`` like any bulk write's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from backfill_assets.core.names import VNODE
from backfill_assets.storage.chunks.chunk_scan import read_task_rows, whole_vnode_tasks
from backfill_assets.storage.delta.delta_rs import VNODE_COUNT_PROPERTY
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.spark_types import exchange_schema
from backfill_assets.storage.rows.write import FileWriter, NewFile, check_written, row_group_rows
from backfill_assets.storage.writes.bulk import BULK_ROWS_HERE, BulkWritten


@dataclass(frozen=True)
class ReadTasks:
    """Tasks that together read every live row of one table version (``columns`` + `vnode`,
    as Arrow types Spark would read them), each a contiguous vnode range."""

    uri: str
    options: Mapping[str, str]
    physical: Mapping[str, str]
    base: pa.Schema
    tasks: tuple[str, ...]

    def read(self, task: str) -> pa.Table:
        """Task ``task``'s rows: DVs applied, partition values from the log."""
        return read_task_rows(self.uri, dict(self.options), self.physical, self.base,
                              json.loads(task))


def read_tasks(snap: TableVersion, columns: Sequence[str], min_tasks: int,
               task_rows: int = BULK_ROWS_HERE) -> ReadTasks:
    """Tasks over every vnode of ``snap`` (a platform table arranged by vnode: its
    ``backfill.vnodeCount`` and a `vnode` column) of about ``task_rows`` rows each."""
    snap.check_readable()
    names = list(dict.fromkeys([*columns, VNODE]))
    base = exchange_schema(pa.schema([snap.arrow_schema.field(c) for c in names]))
    physical = {c: snap.physical_names.get(c, c) for c in names
                if c not in snap.partition_columns}
    vnodes = range(int(snap.configuration[VNODE_COUNT_PROPERTY]))
    tasks = whole_vnode_tasks(snap, vnodes, names, base, task_rows, min_tasks)
    return ReadTasks(snap.uri, dict(snap.storage_options), physical, base, tuple(tasks))


def write_sorted(snap: TableVersion, schema: pa.Schema, rows: pa.Table,
                 max_rows_per_file: int, kept_keys: Sequence[str] = (),
                 table_rows: int = 0) -> list[NewFile]:
    """``rows`` (already in the table's order) as new, uncommitted files of the table of
    ``snap``, as ``schema``, in the table's row groups: nothing names them until
    ``committed_files`` and ``commit_written``. ``kept_keys``: the columns the table's keyed
    commits find rows by; when a table of ``table_rows`` rows fits the key cache, the new
    files' values of them are handed to it (``KeyCache.remember_written``), as the row MV's
    bulk does: else the first small barrier after a bulk reads every file's keys back."""
    writer = FileWriter(snap.uri, dict(snap.storage_options), schema.serialize().to_pybytes(),
                        "", "part", max_rows_per_file,
                        row_group_rows=row_group_rows(snap.configuration))
    batches = iter(rows.select(schema.names).to_batches(max_chunksize=1 << 17))
    files = [NewFile.of(r) for out in writer(batches) for r in out.to_pylist()]
    if kept_keys and key_cache.CACHE.fits(table_rows):
        types = pa.schema([schema.field(k) for k in kept_keys])
        key_cache.CACHE.remember_written(snap.uri, [(f.path, f.size, f.rows) for f in files],
                                         rows.select(list(kept_keys)).cast(types))
    return files


def written_files(snap: TableVersion, files: Sequence[NewFile]) -> BulkWritten:
    """Files ``write_sorted`` wrote, checked in the store at their size, for
    ``commit_written`` (or ``BulkWritten.discard``)."""
    check_written(snap.uri, snap.storage_options, list(files))
    return BulkWritten(snap.uri, dict(snap.storage_options), tuple(files))
