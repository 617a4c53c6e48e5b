"""Merge-on-read: apply keyed changes to a table by deletion vectors and one new file.

A barrier's netted changes (one row per key, ``op`` 'upsert' | 'delete') meet the rows the
table holds for those keys: only the files whose statistics admit a changed key are read
(with their row positions). A replaced or deleted row gets a DV bit (OR-ed with the file's DV
at commit); upserted rows and snapshot-chunk inserts go to new files clustered by (vnode,
key); an upsert equal to the row already there changes nothing. For a table with a change
feed, a commit that deletes anything also writes ``_change_data`` files with exact
``update_preimage`` / ``update_postimage`` / ``insert`` / ``delete`` rows (a version with cdc
files is read only from them); an insert-only commit needs none (its files read as inserts).

Few changes come as ``keyed`` rows instead (each changed key's row before and after, Arrow):
they are found by key lookups on the driver (``keyed.py``: key columns only) rather than by a
Spark read of every column of every file a changed key may be in, which for changes spread
over all vnodes is the whole table. Their new rows and change rows are written on the driver;
the ``inserts`` (a snapshot chunk, possibly large) are still written by Spark; one commit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets.core import names
from backfill_assets.storage.chunks.seek import SEEK_ROWS_PROPERTY
from backfill_assets.storage.delta.delta_rs import VNODE_COUNT_PROPERTY
from backfill_assets.storage.delta.log import Snapshot
from backfill_assets.storage.delta.prune import VNODE, files_holding
from backfill_assets.storage.rows import keyed as keyed_mod
from backfill_assets.storage.rows.commit import Change, Hook, Intent, _no_hook, commit
from backfill_assets.storage.rows.keyed import NEW_FILE_ROWS, KeyedRows
from backfill_assets.storage.rows.scan import FILE_COLUMN, ROW_COLUMN, read_snapshot
from backfill_assets.storage.rows.spark_types import col
from backfill_assets.storage.rows.write import write_files
from backfill_assets.storage.writes.bulk import BulkWritten

OP = names.OP
CHANGE_TYPE = "_change_type"
CHANGE_FOLDER = "_change_data"
FILE_ROWS = 131072  # rows per data file at least: small enough that a changed key reads little
TARGET_FILES = 48  # files a table is written in, at most, once that makes files bigger
MAX_WRITE_TASKS = 64

_OLD, _NEW, _SAME = names.OLD, names.NEW, names.SAME


@dataclass(frozen=True)
class Applied:
    version: int | None  # the committed version (None: nothing to commit)
    rows_written: int
    rows_deleted: int


def file_rows_for(table_rows: int) -> int:
    """Rows per data file for a table of ``table_rows``: FILE_ROWS, or bigger so the table
    has about TARGET_FILES files. Changes spread over all vnodes give every file a DV, and
    delta-rs readers need the files carrying one kept well under 256 (maintain.MAX_DV_FILES):
    with 131k-row files a 100M-row MV has 763 of them, and every barrier would rewrite most."""
    return max(FILE_ROWS, math.ceil(table_rows / TARGET_FILES))


def clustered(df: DataFrame, key_names: Sequence[str], rows: int, vnode_count: int | None,
              file_rows: int = FILE_ROWS) -> DataFrame:
    """``df`` in (vnode, key) order, each task holding one contiguous vnode range (about
    ``rows / file_rows`` tasks): every written file then covers a narrow vnode range with exact
    bounds. The range of a row is computed from its vnode (no sampling pass over the data)."""
    order = [col(VNODE), *[col(k) for k in key_names]]
    parts = max(1, min(MAX_WRITE_TASKS, math.ceil(rows / file_rows)))
    if parts == 1:
        shaped = df.coalesce(1)
    elif vnode_count:
        shaped = df.repartition(parts, F.floor(col(VNODE) * parts / vnode_count))
    else:
        shaped = df.repartitionByRange(parts, *order)
    return shaped.sortWithinPartitions(*order)


def append(spark: SparkSession, snap: Snapshot, rows: DataFrame, key_names: Sequence[str],
           intent: Intent, rows_hint: int, *, file_rows: int | None = None) -> Applied:
    """Commit ``rows`` (keys not in the table yet) as new clustered files."""
    return apply_changes(spark, snap, key_names, intent, inserts=rows, rows_hint=rows_hint,
                         file_rows=file_rows)


def apply_keyed(snap: Snapshot, key_names: Sequence[str], intent: Intent, rows: KeyedRows,
                *, file_rows_max: int = NEW_FILE_ROWS, hook: Hook = _no_hook) -> Applied:
    """One commit of a small barrier's ``rows`` on the driver: ``apply_changes(keyed=rows)``
    without Spark (nothing is written by a Spark job when there are no ``inserts``)."""
    return apply_changes(None, snap, key_names, intent, keyed=rows, file_rows=file_rows_max,
                         hook=hook)


def apply_changes(spark: SparkSession | None, snap: Snapshot, key_names: Sequence[str],
                  intent: Intent, *, changes: DataFrame | None = None,
                  keyed: KeyedRows | None = None,
                  inserts: DataFrame | BulkWritten | None = None,
                  rows_hint: int = 0, file_rows: int | None = None,
                  clustered_inserts: bool = False, hook: Hook = _no_hook) -> Applied:
    """One commit: keyed ``changes`` (table columns + ``OP``) merged on read in Spark, or
    ``keyed`` rows (each changed key's row before and after) found by key lookups on the
    driver, plus ``inserts`` (rows whose keys cannot be in the table: a Spark frame, or the
    ``BulkWritten`` files of `write_bulk`, committed here). ``rows_hint``: about how many
    rows will be written (sizes the files). ``clustered_inserts``: each Spark
    partition of ``inserts`` already holds one vnode range in (vnode, key) order (a seek
    chunk), so they are written as they come, without a shuffle whose only purpose would be
    the layout. A table with ``backfill.seekFileRows`` (the replica) gets its inserts in files
    of one vnode each, about that many rows (what a chunk seeks by). ``hook`` is called
    between the writes (the crash tests kill the process there): ``data_files_written``,
    ``change_files_written``, then ``dv_file_written`` just before the log entry is
    published. A ``keyed`` side the table disagrees with raises ``StorageMismatch`` before
    anything is written."""
    if changes is not None and keyed is not None:
        raise ValueError("apply_changes takes `changes` (Spark) or `keyed` (driver), not both")
    bulk = inserts if isinstance(inserts, BulkWritten) else None
    if bulk is not None:
        if changes is not None or keyed is not None:
            raise ValueError("bulk files are committed alone: they have no change rows for a "
                             "change file")
        inserts = None
    schema = snap.arrow_schema
    cols = schema.names
    cdf = snap.configuration.get("delta.enableChangeDataFeed") == "true"
    file_rows = file_rows or file_rows_for(snap.live_rows + rows_hint)
    located = keyed_mod.locate(snap, key_names, keyed) if keyed is not None else None
    deletes: dict[str, BitMap64] = dict(located.deletes) if located is not None else {}
    parts: list[DataFrame] = []
    cdc_parts: list[DataFrame] = []
    matched = None
    if changes is not None:
        matched = _match(spark, snap, changes, key_names, cols).cache()
        deletes = _deleted_rows(matched)
        is_up, has_old = F.col(OP) == "upsert", F.col(_OLD).isNotNull()
        changed = is_up & ~F.col(_SAME)
        parts.append(matched.where(changed).select(f"{_NEW}.*"))
        cdc_parts += [
            _typed(matched.where(changed & has_old), _OLD, "update_preimage"),
            _typed(matched.where(changed & has_old), _NEW, "update_postimage"),
            _typed(matched.where(changed & ~has_old), _NEW, "insert"),
            _typed(matched.where((F.col(OP) == "delete") & has_old), _OLD, "delete"),
        ]
    vnode_count = snap.configuration.get(VNODE_COUNT_PROPERTY)
    vnode_count = int(vnode_count) if vnode_count else None
    seek_rows = int(snap.configuration.get(SEEK_ROWS_PROPERTY) or 0)
    laid_out: list[tuple[DataFrame, int, str | None]] = []  # (rows, file rows, split column)
    if inserts is not None:
        rows = inserts.select(*[col(c) for c in cols])
        if clustered_inserts:
            laid_out.append((rows, file_rows, None))
        elif seek_rows:
            shaped = clustered(rows, key_names, rows_hint, vnode_count, file_rows)
            laid_out.append((shaped, seek_rows, VNODE))
        else:
            parts.append(rows)
        cdc_parts.append(rows.withColumn(CHANGE_TYPE, F.lit("insert")))
    try:
        if parts:
            data = parts[0]
            for p in parts[1:]:
                data = data.unionByName(p)
            laid_out.append((clustered(data, key_names, rows_hint, vnode_count, file_rows),
                             file_rows, None))
        adds = []
        if bulk is not None:
            adds += bulk.files
        for rows, per_file, split in laid_out:
            adds += write_files(rows, snap.uri, snap.storage_options, schema,
                                max_rows_per_file=per_file, split_column=split)
        if located is not None:
            adds += keyed_mod.write_located(snap, key_names, located,
                                            min(file_rows, NEW_FILE_ROWS))
        if adds or laid_out or bulk is not None:
            hook("data_files_written")
        cdc = []
        if cdf and deletes:
            # the keyed side's change rows are few and written here; a chunk's inserts keep
            # their tasks (one vnode range each) instead of funnelling through one
            cdc = _feed_files(snap, cdc_parts, one_file=located is None)
            if located is not None:
                cdc += keyed_mod.write_located_feed(snap, key_names, located)
            hook("change_files_written")
        change = Change(adds=[a for a in adds if a.rows], cdc=cdc, deletes=deletes)
        written = sum(a.rows for a in adds)
        if change.empty and not intent.txns:
            return Applied(None, 0, 0)
        version = commit(snap, change, intent, hook)
        return Applied(version, written, sum(len(b) for b in deletes.values()))
    finally:
        if matched is not None:
            matched.unpersist()


def _feed_files(snap: Snapshot, cdc_parts: list[DataFrame], one_file: bool) -> list:
    """The Spark side's exact change rows (matched changes, inserts as ``insert``) as
    ``_change_data`` files (``one_file``: through one task, so the many small partitions of
    a merge's union make one file); none when that side has none."""
    if not cdc_parts:
        return []
    feed = cdc_parts[0]
    for p in cdc_parts[1:]:
        feed = feed.unionByName(p)
    cdc_schema = snap.arrow_schema.append(pa.field(CHANGE_TYPE, pa.string()))
    return write_files(feed.coalesce(1) if one_file else feed, snap.uri, snap.storage_options,
                       cdc_schema, folder=CHANGE_FOLDER, prefix="cdc")


def _match(spark: SparkSession, snap: Snapshot, changes: DataFrame,
           key_names: Sequence[str], cols: Sequence[str]) -> DataFrame:
    """Every change with the row the table holds for its key (``__bf_old``, its file and
    row), and whether the upsert equals it (``__bf_same``)."""
    new = changes.select(*[col(k) for k in key_names],
                         F.struct(*[col(c) for c in cols]).alias(_NEW), col(OP))
    keys = changes.select(col(VNODE), *[col(k) for k in key_names]).toArrow()
    touched = files_holding(snap.files, keys, key_names)
    if touched:
        old = read_snapshot(spark, snap, cols, touched, row_ids=True).select(
            *[col(k) for k in key_names], F.struct(*[col(c) for c in cols]).alias(_OLD),
            col(FILE_COLUMN), col(ROW_COLUMN))
        both = new.join(old, on=list(key_names), how="left")
    else:
        null_old = F.lit(None).cast(new.schema[_NEW].dataType)
        both = (new.withColumn(_OLD, null_old)
                .withColumn(FILE_COLUMN, F.lit(None).cast("string"))
                .withColumn(ROW_COLUMN, F.lit(None).cast("long")))
    same = (F.col(OP) == "upsert") & F.col(_OLD).isNotNull() & F.col(_OLD).eqNullSafe(F.col(_NEW))
    return both.withColumn(_SAME, same)


def _deleted_rows(matched: DataFrame) -> dict[str, BitMap64]:
    """Rows whose DV bit this commit sets: replaced (changed upserts) and deleted ones."""
    hit = matched.where(F.col(_OLD).isNotNull() & ~F.col(_SAME)).select(FILE_COLUMN, ROW_COLUMN)
    table = hit.toArrow()
    out: dict[str, BitMap64] = {}
    for path, row in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
        out.setdefault(path, BitMap64()).add(row)
    return out


def _typed(df: DataFrame, side: str, change_type: str) -> DataFrame:
    return df.select(f"{side}.*").withColumn(CHANGE_TYPE, F.lit(change_type))
