"""Merge-on-read by key lookups on the driver: no Spark job, the cost of what changed.

A barrier that carries few changes should cost what changed, not what the table holds. The
caller knows, per changed key, the row the table holds now (``before``: derived from the change
feed's pre-images, which is what the MV or replica was built from) and the row it must hold
(``after``). The layer then only has to find where each held key lives: it reads the key
columns (never the other columns) of the files whose statistics admit a changed key, takes the
rows' positions for the deletion vectors, and writes one file of new rows and one change-data
file from the rows it was given. Nothing goes through Spark. The commit itself is
``merge.apply_keyed``: a small barrier's alone, or a chunked barrier's forwarded changes
beside the snapshot chunk that Spark writes, in one commit.

The table and the change feed must agree: a key ``before`` says is held must be found exactly
once, and a key only ``after`` names must not be found. Otherwise the barrier stops with
``StorageMismatch`` (a row would be lost or invented silently).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from backfill_assets.arrow.netting import rows_by_keys
from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.delta.prune import VNODE, keys_by_file
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.commit import Change, Hook, Intent, _no_hook, commit
from backfill_assets.storage.rows.row_equality import unchanged_dropped
from backfill_assets.storage.rows.scan import FILE_COLUMN, ROW_COLUMN, file_row_groups, file_rows
from backfill_assets.storage.rows.write import row_group_rows, write_table

CHANGE_TYPE = "_change_type"
CHANGE_FOLDER = "_change_data"
_THREADED_FILES = 16  # files a lookup reads (not in the key cache) before it uses threads
_THREADS = min(4, os.cpu_count() or 1)  # each holds one file's key column at a time
NEW_FILE_ROWS = 131072  # rows per file a driver-side commit writes, at most


@dataclass(frozen=True)
class KeyedRows:
    """A barrier's effect on a keyed table, one row per changed key on each side (table
    schema, aligned by key only through the key columns): the rows held now for keys that
    change, and the rows those keys must hold after. A key absent from ``before`` is not
    held; a key absent from ``after`` is deleted."""

    before: pa.Table
    after: pa.Table


@dataclass(frozen=True)
class KeyedResult:
    version: int | None
    rows_written: int
    rows_deleted: int


@dataclass(frozen=True)
class Located:
    """``KeyedRows`` found in a table, nothing written yet: both sides without the keys that
    stay as they are, and the DV bits of the held rows they replace or delete."""

    before: pa.Table
    after: pa.Table
    deletes: dict[str, BitMap64]
    rows_deleted: int


def locate(snap: TableVersion, key_names: Sequence[str], rows: KeyedRows) -> Located:
    """Where ``rows``' keys live in ``snap`` (key columns only, see the module docstring);
    ``StorageMismatch`` when the table disagrees with them. Writes nothing, so a commit that
    calls it before its first write leaves nothing behind when it refuses."""
    schema = snap.arrow_schema
    before, after = unchanged_dropped(rows.before.select(schema.names).cast(schema),
                                      rows.after.select(schema.names).cast(schema), key_names)
    found = _positions(snap, key_names, before, after)
    return Located(before, after, _deletes(found), found.num_rows)


def write_located(snap: TableVersion, key_names: Sequence[str], located: Located,
                  file_rows_max: int = NEW_FILE_ROWS) -> list:
    """The new rows of ``located`` as files clustered by (vnode, key), written here."""
    return write_clustered(snap, key_names, located.after, file_rows_max)


def write_located_feed(snap: TableVersion, key_names: Sequence[str], located: Located) -> list:
    """The exact change-data file of ``located`` (update pre/post images, inserts, deletes)."""
    feed = _change_rows(located.before, located.after, key_names)
    return write_table(feed, snap.uri, snap.storage_options, feed.schema,
                       folder=CHANGE_FOLDER, prefix="cdc", footer_stats=())


def replace_keyed(snap: TableVersion, key_names: Sequence[str], intent: Intent, keys: pa.Table,
                  rows: pa.Table, *, hook: Hook = _no_hook) -> KeyedResult:
    """One commit in which every live row whose key is in ``keys`` is replaced by ``rows``
    (whose keys are among ``keys``; a key without a row is deleted): an overwrite of a few keys
    that costs what it writes, one small file and a DV or a remove. The progress table's
    write: unlike ``apply_keyed`` there is no change feed to agree with, whatever the table
    holds for those keys goes. No change-data files (callers' tables have no change feed)."""
    schema = snap.arrow_schema
    found = _held(snap, key_names, keys.select(list(key_names)))
    adds = write_clustered(snap, key_names, rows.select(schema.names).cast(schema),
                           NEW_FILE_ROWS)
    if adds:
        hook("data_files_written")
    change = Change(adds=adds, deletes=_deletes(found))
    if change.empty and not intent.txns:
        return KeyedResult(None, 0, 0)
    return KeyedResult(commit(snap, change, intent, hook), rows.num_rows, found.num_rows)


def _deletes(found: pa.Table) -> dict[str, BitMap64]:
    """The rows ``_held`` found, as DV bits per file: a bitmap per file built from its rows'
    array (a bit at a time from Python lists cost a tenth of a 23k-group commit)."""
    if not found.num_rows:
        return {}
    paths = found.column(FILE_COLUMN).combine_chunks().dictionary_encode()
    codes = paths.indices.to_numpy(zero_copy_only=False)
    rows = found.column(ROW_COLUMN).to_numpy()
    return {path: BitMap64(rows[codes == i])
            for i, path in enumerate(paths.dictionary.to_pylist())}


def write_clustered(snap: TableVersion, key_names: Sequence[str], rows: pa.Table,
                    file_rows_max: int, *, one_file_unsorted: bool = False) -> list:
    """``rows`` written as new files clustered by (vnode, key), their keys handed to the key
    cache (the next barrier's lookup would read them back: a barrier's new rows, and a
    compaction's rewritten ones, which the barrier after it would otherwise read whole).
    ``one_file_unsorted``: rows that fit one file of one row group are written as they come
    (a keyed rewrite of a small table: its statistics span every vnode and key whatever the
    order inside, so sorting its text keys would buy nothing)."""
    if not rows.num_rows:
        return []
    group_rows = row_group_rows(snap.configuration)
    clustered, footer_stats = rows, None
    if one_file_unsorted and rows.num_rows <= min(file_rows_max, group_rows):
        footer_stats = [VNODE, *key_names]  # one row group: the log's statistics say the rest
    else:
        order = [(VNODE, "ascending"), *[(k, "ascending") for k in key_names if k != VNODE]]
        clustered = rows.take(pc.sort_indices(rows, sort_keys=order))
    files = write_table(clustered, snap.uri, snap.storage_options, snap.arrow_schema,
                        max_rows_per_file=file_rows_max, row_group_rows=group_rows,
                        footer_stats=footer_stats)
    if key_cache.CACHE.fits(sum(f.num_records or 0 for f in snap.files) + rows.num_rows):
        key_cache.CACHE.remember_written(snap.uri, [(f.path, f.size, f.rows) for f in files],
                                         clustered.select(list(key_names)))
    return files


def _positions(snap: TableVersion, key_names: Sequence[str], before: pa.Table,
               after: pa.Table) -> pa.Table:
    """(key, file, row) of every ``before`` key in the table; checks the table agrees."""
    key_cols = [VNODE, *key_names]
    wanted = pa.concat_tables([before.select(key_cols), after.select(key_cols)])
    if len(key_names) == 1:  # the after keys not before too, by a set lookup (no group-by)
        k = key_names[0]
        new = pc.invert(pc.is_in(after.column(k), value_set=before.column(k).combine_chunks()))
        wanted = pa.concat_tables([before.select(key_cols), after.select(key_cols).filter(new)])
    else:
        wanted = wanted.group_by(key_cols, use_threads=False).aggregate([])
    if not wanted.num_rows:
        return pa.table({**{k: [] for k in key_names}, FILE_COLUMN: pa.array([], pa.string()),
                         ROW_COLUMN: pa.array([], pa.int64())})
    found = _held(snap, key_names, wanted)
    check_agrees(snap.uri, key_names, before, found)
    return found


def key_counts(snap: TableVersion, keys: pa.Table, key_names: Sequence[str]) -> pa.Table:
    """How many live rows of ``snap`` hold each of ``keys`` (key columns + ``count``; keys
    held nowhere are left out). Reads only the key columns of files whose statistics admit
    one of the keys: what a duplicate-key check of a few inserted keys costs."""
    wanted = keys.select(list(key_names))
    found = _held(snap, key_names, wanted)
    return found.group_by(list(key_names), use_threads=False).aggregate(
        [(ROW_COLUMN, "count")]).rename_columns([*key_names, "count"])


def _held(snap: TableVersion, key_names: Sequence[str], wanted: pa.Table) -> pa.Table:
    """Live rows of ``snap`` whose key is in ``wanted``: key, file, row (files pruned by
    their statistics, each probed with its share of ``wanted``; files the table no longer
    holds leave the key cache first). Many files are read by a few threads (pyarrow and
    numpy release the GIL). A table with more keys than the cache holds is read past the
    cache: changes spread over all vnodes meet every file at every barrier, and a
    least-recently-used cache smaller than what each barrier cycles through would hit
    nothing while holding its whole limit (a 100M-row catch-up in four steps: 971 MiB)."""
    key_cache.CACHE.keep_live(snap.uri, (f.path for f in snap.files))
    cached = key_cache.CACHE.fits(sum(f.num_records or 0 for f in snap.files))

    def read(f: DataFile) -> bool:  # its keys come from the file, not from the cache
        return not cached or key_cache.CACHE.kept(snap.uri, f.path, f.size, f.num_records,
                                                  key_names) is None

    pairs = keys_by_file(snap.files, wanted, key_names, test_bounds=read)
    to_read = [(f, mine) for f, mine in pairs if read(f)]
    if len(to_read) < _THREADED_FILES:  # kept keys are probed in microseconds: no threads
        held = [_held_in(snap, f, key_names, mine, cached) for f, mine in pairs]
    else:
        with ThreadPoolExecutor(_THREADS) as pool:
            held = list(pool.map(lambda p: _held_in(snap, p[0], key_names, p[1], cached),
                                 pairs))
    return pa.concat_tables(held) if held else _held_in_nothing(snap, key_names)


def _held_in(snap: TableVersion, f: DataFile, key_names: Sequence[str],
             wanted: pa.Table, cached: bool = True) -> pa.Table:
    """The rows of ``f`` (live, DV applied) whose key is in ``wanted``: key, file, row. The
    file's keys come from the process's key cache (``key_cache``: read once per file), the
    DV from the file's current descriptor."""
    schema = snap.arrow_schema
    types = [schema.field(k).type for k in key_names]
    read = lambda: read_keys(snap, f, key_names)  # noqa: E731
    if cached:
        keys = key_cache.CACHE.file_keys(snap.uri, f.path, f.size, f.num_records, key_names,
                                         read)
        rows, found = keys.rows_of(wanted, key_names, types)
    else:
        rows, found = _probe_by_row_group(snap, f, key_names, wanted, types)
    if f.deletion_vector and len(rows):
        deleted = key_cache.CACHE.deleted_rows(
            snap.uri, dv.unique_id(f.deletion_vector),
            lambda: dv.load(snap.uri, f.deletion_vector, snap.storage_options))
        gone = BitMap64(rows) & deleted  # the few found rows an earlier commit deleted
        if gone:
            live = ~np.isin(rows, np.asarray(gone.to_array(), dtype=np.int64))
            rows, found = rows[live], found.filter(pa.array(live))
    return found.append_column(FILE_COLUMN, pa.array([f.path] * len(rows), pa.string())
                               ).append_column(ROW_COLUMN, pa.array(rows, pa.int64()))


def read_keys(snap: TableVersion, f: DataFile, key_names: Sequence[str], live: bool = False
              ) -> pa.Table:
    """All key values of ``f`` in file order, its row count checked against the log; the
    rows its DV deletes dropped when ``live`` (not for the cache, which keeps what never
    changes)."""
    out, physical, partition = _key_columns(snap, f, key_names)
    deleted = dv.load(snap.uri, f.deletion_vector, snap.storage_options) \
        if live and f.deletion_vector else None
    return file_rows(snap.file_uri(f.path), snap.storage_options, physical, out,
                     rows=f.num_records, partition=partition, deleted=deleted)


def _probe_by_row_group(snap: TableVersion, f: DataFile, key_names: Sequence[str],
                        wanted: pa.Table, types: Sequence[pa.DataType]
                        ) -> tuple[np.ndarray, pa.Table]:
    """``key_cache.probe`` of ``f``'s keys (no DV applied) a row group at a time, for a
    lookup past the cache: a thread holds one group's keys (128K rows in the platform's
    files), not the file's (about 2M rows at 100M: merge.TARGET_FILES)."""
    out, physical, partition = _key_columns(snap, f, key_names)
    rows, found = [np.zeros(0, np.int64)], [out.empty_table()]
    for start, keys in file_row_groups(snap.file_uri(f.path), snap.storage_options, physical,
                                       out, rows=f.num_records, partition=partition):
        at, held = key_cache.probe(keys, wanted, key_names, types)
        rows.append(at + start)
        found.append(held.cast(out))
    return np.concatenate(rows), pa.concat_tables(found)


def _key_columns(snap: TableVersion, f: DataFile, key_names: Sequence[str]):
    """How to read ``f``'s key columns: their schema, physical names and partition values."""
    schema = snap.arrow_schema
    out = pa.schema([schema.field(k) for k in key_names])
    parts = [k for k in key_names if k in snap.partition_columns]
    partition = (pa.table({k: pa.array([f.partition_values.get(k)]).cast(schema.field(k).type)
                           for k in parts}) if parts else None)
    physical = {k: snap.physical_names.get(k, k) for k in key_names if k not in parts}
    return out, physical, partition


def _held_in_nothing(snap: TableVersion, key_names: Sequence[str]) -> pa.Table:
    schema = snap.arrow_schema
    return pa.table({**{k: pa.array([], schema.field(k).type) for k in key_names},
                     FILE_COLUMN: pa.array([], pa.string()), ROW_COLUMN: pa.array([], pa.int64())})


def check_agrees(uri: str, key_names: Sequence[str], before: pa.Table,
                  found: pa.Table) -> None:
    """Every key ``before`` names is held exactly once, and no other changed key is held."""
    keys = list(key_names)
    if len(keys) == 1 and _agrees_one_key(before.column(keys[0]), found.column(keys[0])):
        return
    counts = found.group_by(keys, use_threads=False).aggregate([(ROW_COLUMN, "count")])
    twice = counts.filter(pc.greater(counts[f"{ROW_COLUMN}_count"], 1))
    missing = before.select(keys).join(counts.select(keys), keys, join_type="left anti",
                                       use_threads=False)
    extra = counts.select(keys).join(before.select(keys), keys, join_type="left anti",
                                     use_threads=False)
    for table, what in ((twice, "holds more than one row for"),
                        (missing, "does not hold the row its change feed says it holds for"),
                        (extra, "already holds a row for a key its change feed inserts:")):
        if table.num_rows:
            key = table.slice(0, 1).to_pylist()[0]
            raise StorageMismatch(
                f"{uri} {what} key {_text(key, keys)} ({table.num_rows} such keys): the table "
                "and its upstream's change feed disagree (a duplicate key from a writer that "
                "does not enforce the pk, or a table edited by hand). Nothing was written; "
                "verify the MV (verify_job) and rebuild it with reset_mv_job if it differs")


def _agrees_one_key(before: pa.ChunkedArray, found: pa.ChunkedArray) -> bool:
    """``_check_agrees`` for one key column by set lookups (no join plan): True when the
    found keys are distinct and are exactly ``before``'s (else the caller's checks name the
    key that disagrees)."""
    found = found.combine_chunks()
    return (len(pc.unique(found)) == len(found) and len(found) == len(before)
            and pc.all(pc.is_in(before, value_set=found, skip_nulls=True)).as_py() is not False)


def _change_rows(before: pa.Table, after: pa.Table, key_names: Sequence[str]) -> pa.Table:
    """Exact change-data rows: a key on both sides is an update, else an insert or delete."""
    keys = list(key_names)
    if len(keys) == 1:  # one key column (an aggregate's group text): two set lookups
        kept = pc.is_in(before.column(keys[0]), value_set=after.column(keys[0]).combine_chunks())
        set_ = pc.is_in(after.column(keys[0]), value_set=before.column(keys[0]).combine_chunks())
        return pa.concat_tables([
            _typed(before.filter(kept), "update_preimage"),
            _typed(after.filter(set_), "update_postimage"),
            _typed(after.filter(pc.invert(set_)), "insert"),
            _typed(before.filter(pc.invert(kept)), "delete")])
    updated = before.select(keys).join(after.select(keys), keys, join_type="inner",
                                       use_threads=False)
    parts = [
        _typed(rows_by_keys(before, updated, keys, "left semi"), "update_preimage"),
        _typed(rows_by_keys(after, updated, keys, "left semi"), "update_postimage"),
        _typed(rows_by_keys(after, updated, keys, "left anti"), "insert"),
        _typed(rows_by_keys(before, updated, keys, "left anti"), "delete"),
    ]
    return pa.concat_tables(parts)


def _typed(t: pa.Table, change_type: str) -> pa.Table:
    return t.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(change_type, pa.string()),
                                                  t.num_rows))


def _text(row: Mapping, keys: Sequence[str]) -> str:
    return "(" + ", ".join(f"{k}={row[k]!r}" for k in keys) + ")"
