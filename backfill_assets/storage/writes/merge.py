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

One function per kind of input, each one commit: ``apply_changes`` (Spark frames: changes
and/or inserts; ``append``: inserts alone), ``apply_keyed`` (keyed rows on the driver, with
Spark inserts or not), ``commit_written`` (files Python tasks already wrote).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets.core import names
from backfill_assets.storage.chunks.seek import SEEK_ROWS_PROPERTY
from backfill_assets.storage.delta.delta_rs import VNODE_COUNT_PROPERTY
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.delta.prune import VNODE, files_holding
from backfill_assets.storage.rows import keyed, keyed_rewrite
from backfill_assets.storage.rows.commit import Change, Hook, Intent, _no_hook, commit
from backfill_assets.storage.rows.keyed import NEW_FILE_ROWS, KeyedRows
from backfill_assets.storage.rows.scan import FILE_COLUMN, ROW_COLUMN, read_table_version
from backfill_assets.storage.rows.spark_types import col
from backfill_assets.storage.rows.write import row_group_rows, write_files
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
    change: Change | None = None  # what it committed (`maintain.compaction_due` reads it)
    rewrote: bool = False  # the table was rewritten whole (`keyed_rewrite`), not given DVs
    # a rewrite's every live row after it (the table's schema): a caller that holds the
    # table takes them as they are instead of replacing the changed keys in its copy again
    rows: pa.Table | None = None


_WRITER = ThreadPoolExecutor(2, thread_name_prefix="keyed-rewrite")  # a rewrite's change file


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


def append(spark: SparkSession, snap: TableVersion, rows: DataFrame, key_names: Sequence[str],
           intent: Intent, rows_hint: int, *, file_rows: int | None = None) -> Applied:
    """Commit ``rows`` (keys not in the table yet) as new clustered files."""
    return apply_changes(spark, snap, key_names, intent, inserts=rows, rows_hint=rows_hint,
                         file_rows=file_rows)


def apply_changes(spark: SparkSession, snap: TableVersion, key_names: Sequence[str],
                  intent: Intent, changes: DataFrame | None = None, *,
                  inserts: DataFrame | None = None, rows_hint: int = 0,
                  file_rows: int | None = None, clustered_inserts: bool = False,
                  hook: Hook = _no_hook) -> Applied:
    """One commit of Spark frames: keyed ``changes`` (table columns + ``OP``) merged on read,
    plus ``inserts`` (rows whose keys cannot be in the table). ``rows_hint``: about how many
    rows will be written (sizes the files). ``clustered_inserts``: each Spark partition of
    ``inserts`` already holds one vnode range in (vnode, key) order (a seek chunk), so they
    are written as they come, without a shuffle whose only purpose would be the layout. A
    table with ``backfill.seekFileRows`` (the replica) gets its inserts in files of one vnode
    each, about that many rows (what a chunk seeks by). ``hook`` is called between the
    writes (the crash tests kill the process there): ``data_files_written``,
    ``change_files_written``, then ``dv_file_written`` just before the log entry is
    published."""
    side = _SparkSide.of(snap, key_names, rows_hint, file_rows)
    matched = None
    try:
        deletes: dict[str, BitMap64] = {}
        if changes is not None:
            matched = _match(spark, snap, changes, key_names, snap.arrow_schema.names).cache()
            deletes = _deleted_rows(matched)
            side.add_matched(matched)
        side.add_inserts(inserts, clustered_inserts)
        adds = side.write()
        return _published(snap, intent, adds, deletes, bool(side.laid_out),
                          lambda: _feed_files(snap, side.cdc_parts, one_file=True), hook)
    finally:
        if matched is not None:
            matched.unpersist()


def apply_keyed(snap: TableVersion, key_names: Sequence[str], intent: Intent, rows: KeyedRows,
                *, inserts: DataFrame | None = None, rows_hint: int = 0,
                file_rows: int | None = None, clustered_inserts: bool = False,
                whole: pa.Table | None = None, hook: Hook = _no_hook) -> Applied:
    """One commit of ``rows`` (each changed key's row before and after) found by key lookups
    on the driver, plus Spark ``inserts`` as in `apply_changes` (a chunked barrier's
    forwarded changes beside its chunk; without inserts, a small barrier's alone: no Spark
    job). Their new rows are written in files of at most ``file_rows`` (and NEW_FILE_ROWS)
    rows. ``whole``: every live row of ``snap``, when the caller holds them; the commit may
    then rewrite the table instead (``keyed_rewrite``). A side the table disagrees with
    raises ``StorageMismatch`` before anything is written."""
    _refuse_written(inserts)
    planned = None if whole is None or inserts is not None else \
        keyed_rewrite.plan(snap, key_names, rows, whole)
    if planned is not None:
        return _rewritten(snap, key_names, intent, planned, hook)
    located = keyed.locate(snap, key_names, rows)
    side = _SparkSide.of(snap, key_names, rows_hint, file_rows)
    side.add_inserts(inserts, clustered_inserts)
    adds = side.write() + keyed.write_located(snap, key_names, located,
                                                  min(side.file_rows, NEW_FILE_ROWS))
    # the keyed side's change rows are few and written here; a chunk's inserts keep their
    # tasks (one vnode range each) instead of funnelling through one
    return _published(snap, intent, adds, dict(located.deletes), bool(side.laid_out),
                      lambda: _feed_files(snap, side.cdc_parts, one_file=False)
                      + keyed.write_located_feed(snap, key_names, located), hook)


def _rewritten(snap: TableVersion, key_names: Sequence[str], intent: Intent,
               planned: keyed_rewrite.Rewrite, hook: Hook) -> Applied:
    """The commit of a planned rewrite: every live row in new files, every old file removed,
    the changed keys' rows in the change file (even inserts alone: the removes and adds
    carry no change rows where one exists). The change file is written in a thread beside
    the data files (Parquet writes release the GIL, so the two overlap instead of adding up)."""
    feed = None
    if snap.configuration.get("delta.enableChangeDataFeed") == "true":
        feed = _WRITER.submit(keyed.write_located_feed, snap, key_names, planned.located)
    try:
        adds = keyed.write_clustered(snap, key_names, planned.rows, NEW_FILE_ROWS,
                                     one_file_unsorted=True)
    finally:
        cdc = [] if feed is None else feed.result()  # never left running past a refusal
    hook("data_files_written")
    if feed is not None:
        hook("change_files_written")
    change = Change(adds=adds, cdc=cdc, removes=list(snap.files))
    marked = replace(intent, metadata={**intent.metadata,
                                       keyed_rewrite.COMMIT_KIND: "rewrite"})
    version = commit(snap, change, marked, hook)
    return Applied(version, planned.located.after.num_rows, planned.located.rows_deleted,
                   change, rewrote=True, rows=planned.rows)


def commit_written(snap: TableVersion, intent: Intent, written: BulkWritten, *,
                   hook: Hook = _no_hook) -> Applied:
    """One commit of the files `write_bulk` (or `write_chunk`) left uncommitted. They are
    committed alone: inserts only, they have no change rows for a change file."""
    return _published(snap, intent, list(written.files), {}, True, list, hook)


@dataclass
class _SparkSide:
    """The Spark frames one commit writes: ``laid_out`` (rows, rows per file, split column),
    ``merged`` (rows clustered together into files of ``file_rows``), and their exact change
    rows (``cdc_parts``)."""

    snap: TableVersion
    key_names: Sequence[str]
    rows_hint: int
    file_rows: int
    merged: list[DataFrame] = field(default_factory=list)
    laid_out: list[tuple[DataFrame, int, str | None]] = field(default_factory=list)
    cdc_parts: list[DataFrame] = field(default_factory=list)

    @classmethod
    def of(cls, snap: TableVersion, key_names: Sequence[str], rows_hint: int,
           file_rows: int | None) -> _SparkSide:
        return cls(snap, key_names, rows_hint,
                   file_rows or file_rows_for(snap.live_rows + rows_hint))

    @property
    def vnode_count(self) -> int | None:
        count = self.snap.configuration.get(VNODE_COUNT_PROPERTY)
        return int(count) if count else None

    def add_matched(self, matched: DataFrame) -> None:
        """Changed upserts become new rows; every change its exact change rows."""
        is_up, has_old = F.col(OP) == "upsert", F.col(_OLD).isNotNull()
        changed = is_up & ~F.col(_SAME)
        self.merged.append(matched.where(changed).select(f"{_NEW}.*"))
        self.cdc_parts += [
            _typed(matched.where(changed & has_old), _OLD, "update_preimage"),
            _typed(matched.where(changed & has_old), _NEW, "update_postimage"),
            _typed(matched.where(changed & ~has_old), _NEW, "insert"),
            _typed(matched.where((F.col(OP) == "delete") & has_old), _OLD, "delete"),
        ]

    def add_inserts(self, inserts: DataFrame | None, clustered_inserts: bool) -> None:
        _refuse_written(inserts)
        if inserts is None:
            return
        rows = inserts.select(*[col(c) for c in self.snap.arrow_schema.names])
        seek_rows = int(self.snap.configuration.get(SEEK_ROWS_PROPERTY) or 0)
        if clustered_inserts:
            self.laid_out.append((rows, self.file_rows, None))
        elif seek_rows:
            shaped = clustered(rows, self.key_names, self.rows_hint, self.vnode_count,
                               self.file_rows)
            self.laid_out.append((shaped, seek_rows, VNODE))
        else:
            self.merged.append(rows)
        self.cdc_parts.append(rows.withColumn(CHANGE_TYPE, F.lit("insert")))

    def write(self) -> list:
        """The data files of every frame (none when there is none)."""
        if self.merged:
            data = self.merged[0]
            for p in self.merged[1:]:
                data = data.unionByName(p)
            self.laid_out.append((clustered(data, self.key_names, self.rows_hint,
                                            self.vnode_count, self.file_rows),
                                  self.file_rows, None))
            self.merged = []
        adds = []
        for rows, per_file, split in self.laid_out:
            adds += write_files(rows, self.snap.uri, self.snap.storage_options,
                                self.snap.arrow_schema, max_rows_per_file=per_file,
                                split_column=split,
                                row_group_rows=row_group_rows(self.snap.configuration))
        return adds


def _refuse_written(inserts: object) -> None:
    if isinstance(inserts, BulkWritten):
        raise ValueError("bulk files are committed alone (commit_written): they have no change "
                         "rows for a change file")


def _published(snap: TableVersion, intent: Intent, adds: list, deletes: dict[str, BitMap64],
               wrote: bool, feed: Callable[[], list], hook: Hook) -> Applied:
    """The commit of ``adds`` and ``deletes`` (DV bits), with the change files ``feed``
    writes when the table has a change feed and the commit deletes anything (``wrote``: a
    write ran, even one that wrote no row)."""
    if adds or wrote:
        hook("data_files_written")
    cdc = []
    if snap.configuration.get("delta.enableChangeDataFeed") == "true" and deletes:
        cdc = feed()
        hook("change_files_written")
    change = Change(adds=[a for a in adds if a.rows], cdc=cdc, deletes=deletes)
    if change.empty and not intent.txns:
        return Applied(None, 0, 0)
    version = commit(snap, change, intent, hook)
    return Applied(version, sum(a.rows for a in adds), sum(len(b) for b in deletes.values()),
                   change)


def _feed_files(snap: TableVersion, cdc_parts: list[DataFrame], one_file: bool) -> list:
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


def _match(spark: SparkSession, snap: TableVersion, changes: DataFrame,
           key_names: Sequence[str], cols: Sequence[str]) -> DataFrame:
    """Every change with the row the table holds for its key (``__bf_old``, its file and
    row), and whether the upsert equals it (``__bf_same``)."""
    new = changes.select(*[col(k) for k in key_names],
                         F.struct(*[col(c) for c in cols]).alias(_NEW), col(OP))
    keys = changes.select(col(VNODE), *[col(k) for k in key_names]).toArrow()
    touched = files_holding(snap.files, keys, key_names)
    if touched:
        old = read_table_version(spark, snap, cols, touched, row_ids=True).select(
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
