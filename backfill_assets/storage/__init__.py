"""The storage layer: every byte between Spark and Delta goes through this package, and this
module is its one door: code outside ``backfill_assets/storage/`` imports only
``backfill_assets.storage`` (``tests/core/test_layers.py``). Everything below is the public
surface (``__all__``); the modules it comes from are the layer's inside.

- Tables by delta-rs (``delta/delta_rs.py``): ``open_table`` (raises TableNotFound /
  HistoryUnavailable), ``create_table``, ``latest_version``, ``read_table``, ``arrow_schema``,
  the table properties the platform sets (``PK_PROPERTY``, ``VNODE_COUNT_PROPERTY``,
  ``arrangement_properties``), column mapping (``column_mapping``, ``column_identities``);
- a table version by log replay: ``TableVersion.load(uri, version, storage_options)`` (protocol
  checked, files, typed partition values, deletion vectors; ``check_readable``; ``dv``: the
  deletion-vector codec, stored and inline), its head
  without a file list (``open_head``, ``TableHead``), the wait for a table's next commit
  (``wait_for_commit``: the follower);
- ``read_version`` / ``read_table_version``: a version's live rows into Spark (DVs applied, column
  mapping, partition values from the log, row counts checked against the log);
- ``read_raw_changes``: the change feed of a version range as Arrow (named history errors);
  ``change_rows_by_vnode`` / ``estimate_change_rows``: its size from the log alone;
- ``ensure_mor_table``: the platform's own merge-on-read tables (MV, replica);
- chunk reads: ``chunk_files`` + ``read_chunk`` (a seek on the files' statistics, chunked in
  the read tasks), ``chunk_tasks`` + ``write_chunk`` (the same chunk projected and written by
  Python tasks), ``shared_cut`` / ``windowed_cut`` (where no_shuffle's shared chunk ends);
  ``replica``: the arrangement replica's base and change rows;
- ``BulkRows`` + ``write_bulk``: a bulk step's rows read, transformed and written by Python
  tasks alone; the ``BulkWritten`` files are then committed by ``commit_written`` with the
  progress they make (``TransformRefused``: nothing written, write them through Spark);
  ``read_tasks`` + ``write_sorted`` + ``written_files``: the same reads and writes with the
  caller's own work between them (the join MV's bulk);
- ``apply_changes`` / ``append`` with an ``Intent`` (app transactions + commit metadata): one
  commit of new clustered files, deletion vectors and exact change-data files;
  ``KeyedRows`` + ``apply_keyed``: changes applied by key lookups on the driver (or, given
  every row of a small table, by a rewrite of it: ``keyed_rewrite``, its cost rule);
  ``replace_keyed``: the rows of a few keys overwritten (the progress table); ``key_counts``;
  ``rows_of_keys``: the live rows of given keys, reading only the Parquet row groups whose
  statistics admit one (tables written with small groups: ``ROW_GROUP_ROWS_PROPERTY``);
  ``key_cache``: the process's cache of file keys those lookups use;
- ``maintain`` (compaction, DV garbage collection, checkpoints) and the step's own
  ``compaction_due`` / ``compact``;
- bytes that are not Delta: ``objects`` (a local folder or S3: read, write, list,
  ``put_if_absent``), JSON documents (``read_json``, ``write_json``, create-only sequences
  ``read_sequence`` / ``append_sequence``), ``table_uri``, ``settle_driver_memory``;
- ``LRU`` / ``memoized`` / ``clear_all``: every process cache of the package, and its reset
  (store/lru.py).
See docs/ARCHITECTURE.md, "The storage layer", and docs/STORAGE.md.
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
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.delta_rs import (
    PK_PROPERTY,
    VNODE_COUNT_PROPERTY,
    arrangement_properties,
    arrow_schema,
    change_feed_enabled,
    check_commits_safe,
    column_identities,
    column_mapping,
    commit_properties,
    create_table,
    latest_version,
    open_table,
    partition_columns,
    read_table,
    table_configuration,
    table_exists,
    vnode_predicate,
    vnodes_for,
)
from backfill_assets.storage.delta.log import DataFile, TableVersion, check_readable
from backfill_assets.storage.delta.log_head import TableHead, open_head
from backfill_assets.storage.delta.log_wait import wait_for_any_commit, wait_for_commit
from backfill_assets.storage.delta.mor_tables import ensure_mor_table, open_mor_table
from backfill_assets.storage.delta.prune import VNODE, files_in_vnodes, vnode_stats_from_log
from backfill_assets.storage.rows import key_cache, keyed_rewrite, replica
from backfill_assets.storage.rows.change_range import read_raw_changes
from backfill_assets.storage.rows.commit import Intent
from backfill_assets.storage.rows.keyed import KeyedRows, key_counts, replace_keyed
from backfill_assets.storage.rows.keyed_read import row_groups_read, rows_of_keys
from backfill_assets.storage.rows.scan import parallelism, read_table_version
from backfill_assets.storage.rows.spark_types import col, spark_schema, spark_type
from backfill_assets.storage.rows.write import ROW_GROUP_ROWS_PROPERTY
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.documents import (
    append_sequence,
    read_json,
    read_sequence,
    write_json,
)
from backfill_assets.storage.store.lru import LRU, clear_all, memoized
from backfill_assets.storage.store.memory import settle_driver_memory
from backfill_assets.storage.store.objects import StorageOptions
from backfill_assets.storage.store.uris import table_uri
from backfill_assets.storage.writes.bulk import (
    BulkRows,
    BulkWritten,
    TransformRefused,
    local_threads,
    write_bulk,
    write_chunk,
)
from backfill_assets.storage.writes.maintain import (
    DV_KEEP_VERSIONS,
    DV_MIN_AGE_SECONDS,
    compact,
    compaction_due,
    maintain,
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
from backfill_assets.storage.writes.table_tasks import (
    ReadTasks,
    read_tasks,
    write_sorted,
    written_files,
)

__all__ = [
    # tables by delta-rs, and their properties
    "PK_PROPERTY", "VNODE_COUNT_PROPERTY", "arrangement_properties",
    "arrow_schema", "change_feed_enabled", "check_commits_safe", "column_identities",
    "column_mapping", "commit_properties", "create_table", "latest_version", "open_table",
    "partition_columns", "read_table", "table_configuration", "table_exists", "vnode_predicate",
    "vnodes_for", "ensure_mor_table", "open_mor_table",
    # a version by log replay, its head, its next commit
    "DataFile", "TableVersion", "check_readable", "dv", "TableHead", "open_head", "wait_for_commit",
    "wait_for_any_commit",
    "VNODE", "files_in_vnodes", "vnode_stats_from_log",
    # rows in and out
    "read_version", "read_table_version", "parallelism", "col", "spark_schema", "spark_type",
    "read_raw_changes", "change_rows_by_vnode", "estimate_change_rows",
    "Intent", "KeyedRows", "key_counts", "replace_keyed", "key_cache", "keyed_rewrite",
    "replica",
    "rows_of_keys", "row_groups_read", "ROW_GROUP_ROWS_PROPERTY",
    # chunk reads
    "SEEK_ROWS_PROPERTY", "HeldChunk", "SharedCut", "chunk_files", "chunk_tasks", "file_reader",
    "read_chunk", "seek_file_rows", "shared_cut", "vnode_key_stats", "windowed_cut",
    # writes
    "Applied", "BulkRows", "BulkWritten", "FirstChunk", "TransformRefused", "append",
    "apply_changes", "apply_keyed", "commit_written", "file_rows_for", "local_threads",
    "write_bulk", "write_chunk", "write_copy", "ReadTasks", "read_tasks", "write_sorted",
    "written_files",
    "DV_KEEP_VERSIONS", "DV_MIN_AGE_SECONDS", "compact", "compaction_due", "maintain",
    # bytes that are not Delta
    "objects", "StorageOptions", "table_uri", "append_sequence", "read_json", "read_sequence",
    "write_json", "settle_driver_memory",
    # every process cache (store/lru.py)
    "LRU", "clear_all", "memoized",
]


def read_version(spark: SparkSession, uri: str, version: int | None,
                 schema: pa.Schema | None = None, vnodes: Iterable[int] | None = None, *,
                 storage_options: Mapping[str, str] | None = None,
                 cluster_keys: Sequence[str] | None = None) -> DataFrame:
    """The rows of ``version`` (latest when None) of the table at ``uri``: the columns of
    ``schema`` (default: all) with its types, restricted to ``vnodes`` when given (files pruned
    by their vnode partition or statistics; the table then needs a ``vnode`` column)."""
    snap = TableVersion.load(uri, version, storage_options)
    columns = schema.names if schema is not None else snap.arrow_schema.names
    files = snap.files
    wanted = None
    if vnodes is not None:
        if VNODE not in columns:
            raise ValueError(f"read_version of {uri} with vnodes needs a {VNODE!r} column")
        wanted = sorted({int(v) for v in vnodes})
        files = files_in_vnodes(files, wanted)
    df = read_table_version(spark, snap, columns, files, cluster_keys=cluster_keys)
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
    return change_rows(TableVersion(uri.rstrip("/"), so, open_head(uri, end, so)), start_exclusive,
                       end, column)
