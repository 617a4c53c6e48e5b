"""The arrangement replica's copy, written by the bulk tasks (storage/writes/bulk.py), that
also writes each vnode's first chunk into the MV from the rows it already holds sorted: one
pass over them, not a copy and then a read back of the chunk (``FirstChunk``).

Why a module of its own: the copy is the one bulk write with two outputs (the replica's
one-vnode files with exact key bounds, and the MV's first chunk), and its task and manifest
handling are its own; the rest of the bulk machinery is shared with ``bulk.py``.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets.core.keys import Key
from backfill_assets.storage.chunks.chunk_task import first_of_each_vnode, ranked
from backfill_assets.storage.rows.write import FileWriter, NewFile, check_written
from backfill_assets.storage.store import objects
from backfill_assets.storage.writes.bulk import (
    BAD_KEY,
    RN,
    VNODE,
    BulkRows,
    BulkWritten,
    _BulkTask,
    _collected,
    _pickled,
    _report,
    _stats,
    planned_tasks,
    run_tasks,
)


@dataclass(frozen=True)
class FirstChunk:
    """What a replica's copy also writes: each vnode's first ``limit`` rows, through
    ``transform``, as new files of the table at ``table_uri`` (a chunked barrier's first
    chunk, taken from the rows the copy already holds sorted: one pass over them, not a
    copy and then a read back of the chunk)."""

    limit: int
    transform: Callable[[pa.Table], pa.Table]
    refusal: type[Exception]
    table_uri: str
    storage_options: Mapping[str, str]
    schema: pa.Schema
    max_rows_per_file: int
    tail: int = 0  # a vnode of at most limit + tail rows is written whole (chunk_cut)
    boundary: int = 0  # rows of a vnode's first replica file: the chunk may end there


def write_copy(spark: SparkSession, rows: BulkRows, table_uri: str,
               storage_options: Mapping[str, str], schema: pa.Schema, *,
               max_rows_per_file: int, first: FirstChunk
               ) -> tuple[BulkWritten, BulkWritten | None]:
    """``write_bulk`` of a replica's copy (one-vnode files with exact key bounds) that also
    writes ``first``; its files and per-vnode stats of the chunk (rows, last key, pk
    flags), or None when its transform refused a value (nothing of it left)."""
    key_sort = [(c.name, "descending" if c.descending else "ascending")
                for c in rows.key_order.columns]
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                        "", "part", max_rows_per_file, VNODE, key_sort)
    to = FileWriter(first.table_uri, dict(first.storage_options),
                    first.schema.serialize().to_pybytes(), "", "part", first.max_rows_per_file)
    tasks, threads = planned_tasks(spark, rows)
    manifest = run_tasks(spark, tasks, _CopyTask(rows, writer, first, to), threads)
    copied = _collected(manifest, table_uri, storage_options)
    reports = [json.loads(r["stats"]) for r in manifest if r["path"] is None]
    chunk = BulkWritten(first.table_uri, dict(first.storage_options), tuple(
        NewFile.of(r["first_file"]) for r in reports if "first_file" in r))
    if any("first_refused" in r for r in reports) or copied.bad_keys:
        chunk.discard()
        return copied, None
    stats: dict[int, tuple[int, Key, bool]] = {}
    exhausted: set[int] = set()
    for r in reports:
        if "first" in r:
            stats.update(pickle.loads(base64.b64decode(r["first"])))
            exhausted.update(r["first_exhausted"])
    check_written(first.table_uri, first.storage_options, list(chunk.files))
    return copied, BulkWritten(chunk.table_uri, chunk.storage_options, chunk.files, stats,
                               frozenset(exhausted))


class _CopyTask(_BulkTask):
    """A replica copy's task: the rows sorted once, written as the replica's files, then
    each vnode's first rows (the first chunk) through the MV's transform into its files."""

    def __init__(self, rows: BulkRows, writer: FileWriter, first: FirstChunk,
                 to: FileWriter):
        super().__init__(rows, writer)
        self.first, self.to = first, to

    def _task(self, task: dict):
        rows, stats, _, _ = self._rows(task)
        if any(bad for _, _, bad in stats.values()):
            yield _report({"vnodes": _pickled(stats)})
            return
        yield from self.writer(iter(self.transform(rows).to_batches(max_chunksize=1 << 17)))
        first, exhausted = first_of_each_vnode(rows, self.first.limit, self.first.tail,
                                               self.first.boundary)
        chunk = ranked(first, self.key_order)
        written: list[str] = []
        try:
            out = self.first.transform(chunk.drop_columns([RN, BAD_KEY]))
            for entry in self.to(iter(out.to_batches(max_chunksize=1 << 17))):
                row = entry.to_pylist()[0]
                written.append(row["path"])
                yield _report({"first_file": row})
        except self.first.refusal as refused:
            for path in written:
                objects.delete(objects.join(self.to.table_uri, path), self.to.options)
            yield _report({"first_refused": str(refused)})
        yield _report({"vnodes": _pickled(stats), "first_exhausted": sorted(exhausted),
                       "first": _pickled(_stats(chunk, self.key_order))})
