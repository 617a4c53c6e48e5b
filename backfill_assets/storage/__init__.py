"""The storage layer: every byte between Spark and Delta goes through this package.

Public surface (everything else in the package is its inside):
- ``Snapshot.load(uri, version, storage_options)``: a table version (protocol checked, files,
  typed partition values, deletion vectors);
- ``read_version`` / ``read_snapshot``: a version's live rows into Spark (DVs applied, column
  mapping, partition values from the log, row counts checked against the log);
- ``ensure_mor_table``: the platform's own merge-on-read tables (MV, replica);
- ``chunk_files`` + ``read_chunk``: a chunked barrier's snapshot rows by a seek on the files'
  statistics, chunked in the read tasks (seek.py, chunk_read.py); ``chunk_tasks`` +
  ``write_chunk``: the same chunk projected and written by Python tasks (two-phase, as
  ``write_bulk``); ``shared_cut``: where no_shuffle's shared chunk ends, from the candidates'
  key columns on the driver (then ``chunk_tasks(cut=...)``); ``windowed_cut``: the same, with
  the chunk's rows, from a window of the next chunks held between barriers and kept at each
  barrier's version by the change feed (cut_window.py); ``replica``: the arrangement
  replica's base and change rows (replica.py);
- ``BulkRows`` + ``write_bulk``: a bulk step's rows read, transformed (an exact Arrow
  projection) and written by Python tasks alone, which report each vnode's rows and last key;
  the ``BulkWritten`` files are then committed by ``commit_written`` with the progress they
  make (``TransformRefused``: nothing written, write them through Spark);
- ``apply_changes`` (Spark frames: keyed changes merged on read and/or inserts) / ``append``
  (inserts alone) with an ``Intent`` (app transactions + commit metadata): one commit of new
  clustered files, deletion vectors and exact change-data files (files sized by
  ``file_rows_for`` the table's rows);
- ``KeyedRows`` (each changed key's row before and after): found by key lookups on the
  driver instead of a Spark merge, with ``apply_keyed`` (a small barrier: no Spark job; or a
  chunked barrier's forwarded changes beside its Spark-written chunk, one commit);
  ``replace_keyed``: the rows of a few keys overwritten (the progress table); ``key_counts``:
  rows per key, reading only key columns;
- ``change_rows_by_vnode``: a version range's change rows per vnode, estimated from the log
  alone (how snapshot mode sizes its catch-up steps); ``estimate_change_rows``: the same for
  any table, after the checks a read of the range makes (how a barrier chooses by cost);
- ``maintain``: compaction, DV garbage collection, checkpoints (see maintain.py);
- ``LRU`` / ``memoized`` / ``clear_all``: every process cache of the package, and its reset.
See docs/ARCHITECTURE.md, "The storage layer".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets.storage.chunks.chunk_scan import (
    HeldChunk,
    chunk_tasks,
    file_reader,
    read_chunk,
    vnode_key_stats,
)
from backfill_assets.storage.chunks.cut_window import windowed_cut
from backfill_assets.storage.chunks.seek import SEEK_ROWS_PROPERTY, chunk_files, seek_file_rows
from backfill_assets.storage.chunks.shared_cut import SharedCut, shared_cut
from backfill_assets.storage.delta.log import DataFile, Snapshot
from backfill_assets.storage.delta.prune import VNODE, files_in_vnodes, vnode_stats_from_log
from backfill_assets.storage.delta.tables import ensure_mor_table, open_mor_table
from backfill_assets.storage.rows.commit import Intent
from backfill_assets.storage.rows.keyed import KeyedRows, key_counts, replace_keyed
from backfill_assets.storage.rows.scan import parallelism, read_snapshot
from backfill_assets.storage.rows.spark_types import col, spark_type
from backfill_assets.storage.store.lru import LRU, clear_all, memoized
from backfill_assets.storage.writes.bulk import (
    BulkRows,
    BulkWritten,
    TransformRefused,
    local_threads,
    write_bulk,
    write_chunk,
)
from backfill_assets.storage.writes.merge import (
    Applied,
    append,
    apply_changes,
    apply_keyed,
    commit_written,
    file_rows_for,
)
from backfill_assets.storage.writes.replica_copy import FirstChunk, write_copy

__all__ = ["SEEK_ROWS_PROPERTY", "Applied", "BulkRows", "BulkWritten", "DataFile", "FirstChunk",
           "Intent",
           "LRU", "clear_all", "memoized",  # every process cache (store/lru.py)
           "HeldChunk", "KeyedRows", "Snapshot", "TransformRefused",
           "append", "apply_changes", "change_rows_by_vnode", "apply_keyed", "chunk_files",
           "estimate_change_rows",
           "commit_written",
           "chunk_tasks",
           "ensure_mor_table",
           "file_reader", "file_rows_for", "key_counts", "local_threads", "open_mor_table",
           "parallelism", "read_chunk",
           "read_snapshot",
           "read_version", "replace_keyed", "seek_file_rows", "shared_cut", "SharedCut",
           "spark_type", "vnode_key_stats",
           "vnode_stats_from_log", "windowed_cut", "write_bulk", "write_chunk", "write_copy"]


def read_version(spark: SparkSession, uri: str, version: int | None,
                 schema: pa.Schema | None = None, vnodes: Iterable[int] | None = None, *,
                 storage_options: Mapping[str, str] | None = None,
                 cluster_keys: Sequence[str] | None = None) -> DataFrame:
    """The rows of ``version`` (latest when None) of the table at ``uri``: the columns of
    ``schema`` (default: all) with its types, restricted to ``vnodes`` when given (files pruned
    by their vnode partition or statistics; the table then needs a ``vnode`` column)."""
    snap = Snapshot.load(uri, version, storage_options)
    columns = schema.names if schema is not None else snap.arrow_schema.names
    files = snap.files
    wanted = None
    if vnodes is not None:
        if VNODE not in columns:
            raise ValueError(f"read_version of {uri} with vnodes needs a {VNODE!r} column")
        wanted = sorted({int(v) for v in vnodes})
        files = files_in_vnodes(files, wanted)
    df = read_snapshot(spark, snap, columns, files, cluster_keys=cluster_keys)
    if schema is not None:
        df = df.select(*[col(f.name).cast(spark_type(f.type)).alias(f.name)
                         for f in schema])
    if wanted is not None:
        df = df.where(F.col(VNODE).isin(wanted))
    return df


def change_rows_by_vnode(uri: str, start_exclusive: int, end: int,
                         storage_options: Mapping[str, str] | None = None
                         ) -> dict[int, int] | None:
    """Estimated change rows of versions (start_exclusive, end] of the table at ``uri`` per
    vnode (its ``vnode`` partition value), from the log alone (`changes.change_rows`); None
    when the table is not partitioned by vnode. HistoryUnavailable when a commit is gone."""
    return _change_rows(uri, start_exclusive, end, storage_options, "vnode")


def estimate_change_rows(uri: str, start_exclusive: int, end: int,
                         storage_options: Mapping[str, str] | None = None) -> dict[int, int]:
    """Estimated change rows of versions (start_exclusive, end] of the table at ``uri``, from
    its log alone (`changes.change_rows`): per ``vnode`` partition value, or all under -1 for
    a table not partitioned by vnode. First the checks a read of the range makes
    (ChangeFeedDisabled, HistoryUnavailable: the range is not readable)."""
    from backfill_assets.storage.rows.change_range import check_range

    check_range(uri, start_exclusive, end, storage_options)
    by_vnode = _change_rows(uri, start_exclusive, end, storage_options, "vnode")
    if by_vnode is not None:
        return by_vnode
    return _change_rows(uri, start_exclusive, end, storage_options, None) or {}


def _change_rows(uri: str, start_exclusive: int, end: int,
                 storage_options: Mapping[str, str] | None, column: str | None
                 ) -> dict[int, int] | None:
    from backfill_assets.storage.delta.log_head import open_head
    from backfill_assets.storage.rows.change_feed import change_rows

    so = dict(storage_options or {})
    return change_rows(Snapshot(uri.rstrip("/"), so, open_head(uri, end, so)), start_exclusive,
                       end, column)
