"""Keeping a merge-on-read table fast and small: compaction, DV garbage, checkpoints.

- Compaction rewrites the files whose deleted fraction is high, the small files barriers leave
  behind, and enough DV'd files to keep their number far below delta-rs' scan deadlock (above
  ~512 files carrying a DV, ``scan``/``QueryBuilder`` can hang: delta-rs #4657). Writers size
  files by the table (``merge.file_rows_for``: at most about TARGET_FILES of them), so changes
  spread over every file leave at most that many DV'd files instead of forcing a rewrite of
  most of a large table. A small compaction runs in Arrow on the driver. It is a
  ``dataChange: false`` commit (no change-feed rows), restricted to files inside one run's vnode
  span so runs over disjoint vnode ranges never remove each other's files.
- DV garbage: superseded DV files are never collected by delta-rs' lite vacuum, and
  ``vacuum(full=True)`` of deltalake 1.6.6 deletes LIVE ones (never run it on these tables).
  ``collect_dv_garbage`` deletes DV files no version in the kept window references.
- ``maintain`` = compaction + DV garbage + lite vacuum of removed data files + checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from backfill_assets.storage.chunks.seek import SEEK_ROWS_PROPERTY
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.delta_rs import VNODE_COUNT_PROPERTY
from backfill_assets.storage.delta.log import DataFile, TableVersion, commit_uri
from backfill_assets.storage.delta.prune import VNODE, files_within_vnodes
from backfill_assets.storage.rows import keyed
from backfill_assets.storage.rows.commit import Change, Intent, commit
from backfill_assets.storage.rows.scan import file_rows, read_table_version
from backfill_assets.storage.rows.write import NewFile, row_group_rows, write_files
from backfill_assets.storage.store import objects
from backfill_assets.storage.writes.merge import FILE_ROWS, Applied, clustered, file_rows_for

DELETED_FRACTION = 0.25  # a file with more deleted rows than this is rewritten
MAX_DV_FILES = 128  # files carrying a DV, at most (delta-rs deadlocks above ~512)
MAX_SMALL_FILES = 32  # barrier-sized files tolerated before they are merged
SMALL_FILE_ROWS = FILE_ROWS // 8
DV_KEEP_VERSIONS = 100  # DV files a reader of the last N versions may need are kept
DV_MIN_AGE_SECONDS = 3600.0  # never collect a DV file younger than this (in-flight commits)
DRIVER_COMPACT_ROWS_DEFAULT = 1_000_000
DRIVER_COMPACT_ROWS = DRIVER_COMPACT_ROWS_DEFAULT  # live rows up to which compaction is Arrow


@dataclass
class MaintenanceReport:
    compacted_files: int = 0
    rewritten_rows: int = 0
    dv_files_deleted: int = 0
    vacuumed_files: int = 0
    checkpoint: int | None = None
    version: int | None = None  # the compaction's commit (its writer's caches move to it)


def files_to_compact(files: Sequence[DataFile], seek_layout: bool = False) -> list[DataFile]:
    """Heavily deleted files, the small ones once there are many, and the most deleted DV'd
    files beyond MAX_DV_FILES. ``seek_layout`` (a ``backfill.seekFileRows`` table): files of
    one vnode are its layout, sized for a chunk, never "small"; only the barriers' files
    spanning several vnodes are."""
    pick = {f.path: f for f in files
            if f.num_records and f.deleted / f.num_records > DELETED_FRACTION}
    small = [f for f in files if (f.num_records or 0) < SMALL_FILE_ROWS
             and not (seek_layout and _one_vnode(f))]
    if len(small) > MAX_SMALL_FILES:
        pick.update({f.path: f for f in small})
    carrying = sorted((f for f in files if f.deletion_vector and f.path not in pick),
                      key=lambda f: f.deleted / max(f.num_records or 1, 1), reverse=True)
    overflow = len(carrying) + sum(1 for f in pick.values() if f.deletion_vector) - MAX_DV_FILES
    for f in carrying[:max(0, overflow + MAX_DV_FILES // 2)] if overflow > 0 else []:
        pick[f.path] = f
    return list(pick.values())


def compaction_due(before: TableVersion, applied: Applied, vnodes: Iterable[int]) -> bool:
    """Whether ``compact`` would rewrite files of ``vnodes``' span in the version ``applied``
    committed on top of ``before``, judged from ``before``'s files and the change alone: a
    small barrier then loads no version to learn that nothing is due (a fresh load of the
    new version would be a large share of its cost). True (load and look) when the commit was
    not the next version of ``before`` (it was rebased over another writer's). A commit that
    removed files whole (a keyed rewrite) leaves the rest and its adds."""
    change = applied.change
    if applied.version is None or change is None or applied.version != before.version + 1:
        return True
    removed = {f.path for f in change.removes}
    files = []
    for f in before.files:
        now = len(change.deletes.get(f.path) or ())
        if f.path in removed:
            continue
        if not now:
            files.append(f)
        elif f.deleted + now < (f.num_records or 0):  # the rows found live: disjoint from its DV
            files.append(_with_deleted(f, f.deleted + now))
    files += [_data_file(a) for a in change.adds]
    within = files_within_vnodes(files, vnodes)
    chosen = files_to_compact(within, bool(before.configuration.get(SEEK_ROWS_PROPERTY)))
    return len(chosen) >= 2 or any(f.deletion_vector for f in chosen)


def _with_deleted(f: DataFile, deleted: int) -> DataFile:
    """``f`` as the next version lists it: a DV of ``deleted`` rows (what the check reads)."""
    return replace(f, deletion_vector={**(f.deletion_vector or {}), "cardinality": deleted})


def _data_file(add: NewFile) -> DataFile:
    """A file a commit added, as a version lists it (rows, and the vnode bounds the checks
    read from its statistics)."""
    stats = json.loads(add.stats) if add.stats else {}
    bounds = {(side, VNODE): (stats.get(f"{side}Values") or {}).get(VNODE)
              for side in ("min", "max")}
    return DataFile(add.path, add.size, add.rows, {}, bounds)


def _one_vnode(f: DataFile) -> bool:
    lo, hi = f.stats.get(("min", VNODE)), f.stats.get(("max", VNODE))
    return lo is not None and lo == hi


def compact(spark: SparkSession, snap: TableVersion, key_names: Sequence[str],
            vnodes: Iterable[int] | None = None, *, force: bool = False) -> MaintenanceReport:
    """Rewrite what ``files_to_compact`` picks (all files of the span with ``force``) among
    the files inside ``vnodes``' span (all files when None) into clustered files."""
    files = snap.files if vnodes is None else files_within_vnodes(snap.files, vnodes)
    seek_rows = int(snap.configuration.get(SEEK_ROWS_PROPERTY) or 0)
    chosen = list(files) if force else files_to_compact(files, bool(seek_rows))
    if len(chosen) < 2 and not any(f.deletion_vector for f in chosen):
        return MaintenanceReport()
    live = sum(f.live_records or 0 for f in chosen)
    per_file = seek_rows or file_rows_for(snap.live_rows)
    if live <= DRIVER_COMPACT_ROWS and not seek_rows:
        adds = _rewrite_on_driver(snap, chosen, key_names, per_file)
    else:
        vnode_count = snap.configuration.get(VNODE_COUNT_PROPERTY)
        rows = read_table_version(spark, snap, snap.arrow_schema.names, chosen)
        shaped = clustered(rows, key_names, live, int(vnode_count) if vnode_count else None,
                           per_file)
        adds = write_files(shaped, snap.uri, snap.storage_options, snap.arrow_schema,
                           max_rows_per_file=per_file, split_column=VNODE if seek_rows else None,
                           row_group_rows=row_group_rows(snap.configuration))
    written = sum(a.rows for a in adds)
    if written != live:
        raise AssertionError(f"compaction of {snap.uri} read {written} rows, the log records "
                             f"{live} live rows: nothing was committed")
    version = commit(snap, Change(adds=[a for a in adds if a.rows], removes=chosen,
                                  data_change=False), Intent(operation="OPTIMIZE"))
    return MaintenanceReport(compacted_files=len(chosen), rewritten_rows=written,
                             version=version)


def _rewrite_on_driver(snap: TableVersion, files: Sequence[DataFile], key_names: Sequence[str],
                       per_file: int) -> list:
    """A small compaction (the files a few barriers left) in Arrow on the driver: the files'
    live rows read, sorted by (vnode, key) and written, without the fixed cost of Spark jobs
    that would make the barrier that runs it several times slower than its neighbours. The
    new files' keys go to the key cache as a barrier's new file's do."""
    schema = snap.arrow_schema
    physical = {c: snap.physical_names.get(c, c) for c in schema.names}
    parts = [file_rows(snap.file_uri(f.path), snap.storage_options, physical, schema,
                       rows=f.num_records,
                       deleted=dv.load(snap.uri, f.deletion_vector, snap.storage_options))
             for f in files]
    rows = pa.concat_tables([schema.empty_table(), *parts])
    return keyed.write_clustered(snap, key_names, rows, per_file)


def collect_dv_garbage(snap: TableVersion, keep_versions: int = DV_KEEP_VERSIONS,
                       min_age_seconds: float = DV_MIN_AGE_SECONDS) -> int:
    """Delete DV files that neither this version nor a reader of the last ``keep_versions``
    versions needs (a DV live at version w is live now or was removed after w)."""
    needed = {dv.relative_path(f.deletion_vector) for f in snap.files if f.deletion_vector}
    for v in range(max(0, snap.version - keep_versions), snap.version + 1):
        try:
            raw = objects.read_bytes(commit_uri(snap.uri, v), snap.storage_options).decode()
        except (FileNotFoundError, OSError):
            continue  # cleaned up by log retention: no reader can ask for it
        for line in raw.splitlines():
            if '"deletionVector"' in line and '"remove"' in line:
                descriptor = json.loads(line)["remove"].get("deletionVector")
                if descriptor:
                    needed.add(dv.relative_path(descriptor))
    now, deleted = time.time(), 0
    for rel, mtime in objects.list_recursive(snap.uri, snap.storage_options):
        name = rel.rsplit("/", 1)[-1]
        if not (name.startswith("deletion_vector_") and name.endswith(".bin")):
            continue
        if rel in needed or now - mtime < min_age_seconds:
            continue
        objects.delete(objects.join(snap.uri, rel), snap.storage_options)
        deleted += 1
    return deleted


def maintain(spark: SparkSession, uri: str, key_names: Sequence[str],
             storage_options=None, *, retention_hours: float = 168.0,
             dv_keep_versions: int = DV_KEEP_VERSIONS,
             dv_min_age_seconds: float = DV_MIN_AGE_SECONDS) -> MaintenanceReport:
    """The documented maintenance of a platform table (the ``maintain_job``)."""
    snap = TableVersion.load(uri, None, storage_options)
    report = compact(spark, snap, key_names)
    snap = TableVersion.load(uri, None, storage_options)
    report.dv_files_deleted = collect_dv_garbage(snap, dv_keep_versions, dv_min_age_seconds)
    table = DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
    report.vacuumed_files = len(table.vacuum(retention_hours=int(retention_hours),
                                             dry_run=False, enforce_retention_duration=False,
                                             full=False))
    table.create_checkpoint()
    report.checkpoint = table.version()
    return report
