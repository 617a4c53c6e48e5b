"""The change feed of a version range with named errors: the one entry point callers use.

Checks what delta-rs would not (the change data feed on at both ends of the range, the range
inside the table's history), then reads the range from the log (``change_feed``, not delta-rs
``load_cdf``, which mis-encodes some partition paths) and turns a vacuumed file into
HistoryUnavailable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from backfill_assets.arrow.types import normalize_schema
from backfill_assets.core.errors import (
    ChangeFeedDisabled,
    HistoryUnavailable,
    InvalidVersionRange,
    UpstreamSchemaChanged,
)
from backfill_assets.storage.delta.change_log import actions_of
from backfill_assets.storage.delta.delta_rs import (
    CDF_COLUMNS,
    CDF_PROPERTY,
    StorageOptions,
    arrow_schema,
    change_feed_enabled,
    column_identities,
    first_line,
    is_missing_history,
    latest_version,
)
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.delta.log_head import open_head
from backfill_assets.storage.rows.change_feed import metadata_changed, read_change_range


def read_raw_changes(
    uri: str,
    start_exclusive: int,
    end: int,
    columns: Sequence[str] | None = None,
    *,
    vnodes: Iterable[int] | None = None,
    storage_options: StorageOptions = None,
) -> pa.Table:
    """The change data feed rows with ``start_exclusive < _commit_version <= end``.

    Columns: the table's columns (or ``columns``) plus ``_change_type`` and
    ``_commit_version`` (and ``_commit_timestamp`` unless ``columns`` is given); strings as
    ``string`` (not ``string_view``). ``vnodes`` keeps the rows of those vnodes (a platform
    table with a ``vnode`` column). Read by the storage layer from the log
    (``storage.rows.change_feed``), not by delta-rs ``load_cdf`` (it mis-encodes some
    partition paths).
    Raises UpstreamSchemaChanged when a version of the range lacks one of ``columns``,
    ChangeFeedDisabled when the change data feed is off at either end of the range,
    HistoryUnavailable when a version of the range is out of the table's history or its files
    were vacuumed, InvalidVersionRange when ``end < start_exclusive`` or
    ``start_exclusive < -1``.
    """
    dt = _checked_range(uri, start_exclusive, end, storage_options)
    wanted = None
    if columns is not None:
        wanted = [*columns, *(c for c in CDF_COLUMNS[:2] if c not in columns)]
    if end == start_exclusive:
        return _empty_changes(dt, wanted)
    if columns is not None:
        _refuse_missing_columns(uri, start_exclusive, end, columns, storage_options, dt)
    try:
        table = read_change_range(TableVersion(uri.rstrip("/"), dict(storage_options or {}), dt),
                                  start_exclusive, end, wanted, vnodes)
    except (DeltaError, OSError, pa.ArrowException) as exc:
        if is_missing_history(exc):
            raise HistoryUnavailable(
                f"changes ({start_exclusive}, {end}] of {uri} are no longer available "
                f"({first_line(exc)}): the files were vacuumed or the log was cleaned up; "
                "rebuild from the latest version (a new backfill) or keep history longer "
                "(delta.deletedFileRetentionDuration / delta.logRetentionDuration)"
            ) from None
        raise
    return _normalize_changes(table)


def _refuse_missing_columns(uri: str, start_exclusive: int, end: int, columns: Sequence[str],
                            storage_options: StorageOptions, dt: DeltaTable) -> None:
    """A column asked for that a version of the range did not have: its change rows there
    lack it, so the range cannot be read exactly (only a range that changed the metadata is
    looked at)."""
    if not metadata_changed(uri, start_exclusive + 1, end, storage_options, dt):
        return
    found = missing_columns(uri, start_exclusive + 1, end, columns, storage_options, dt)
    if found is not None:
        version, lost = found
        raise UpstreamSchemaChanged(
            f"{uri}: version {version} has no column {', '.join(map(repr, lost))} (dropped or "
            f"renamed, since brought back), so the change rows of ({start_exclusive}, {end}] "
            "cannot be read exactly: rebuild what reads them from a version after that (an "
            "MV: reset_mv_job, then a new backfill)"
        )


def missing_columns(uri: str, first: int, last: int, columns: Sequence[str],
                    storage_options: Mapping[str, str] | None = None,
                    table: DeltaTable | None = None) -> tuple[int, list[str]] | None:
    """The first version of first..last whose schema lacks one of ``columns`` (as ``table``,
    opened at ``last``, names them: by physical name under column mapping), with those
    columns; None when every version has them. Such a version's change rows lack the column
    (a column dropped or renamed away, then brought back by RESTORE or a rename): no reader
    can give them exactly, and Delta-Spark's readChangeFeed refuses such a range too."""
    snap = TableVersion(uri.rstrip("/"), dict(storage_options or {}), table)
    wanted = {c: snap.physical_names.get(c, c) for c in columns if c in snap.physical_names}
    for v in range(first, last + 1):
        if not any("metaData" in a for a in actions_of(snap, v)):
            continue
        there = {physical for _, physical in
                 column_identities(open_head(uri, v, storage_options)).values()}
        lost = [c for c, physical in wanted.items() if physical not in there]
        if lost:
            return v, lost
    return None


def check_range(uri: str, start_exclusive: int, end: int,
                storage_options: StorageOptions = None) -> None:
    """Raise what ``read_raw_changes`` would raise of the range before reading a row of it
    (ChangeFeedDisabled, HistoryUnavailable, InvalidVersionRange): a caller that only sizes
    the range (a barrier choosing by cost) learns whether it is readable. A vacuumed file is
    found by a read only."""
    _checked_range(uri, start_exclusive, end, storage_options)


def _checked_range(uri: str, start_exclusive: int, end: int,
                   storage_options: StorageOptions):
    """The head of ``end`` once the range is known to be readable: in order, inside the
    table's history, and with the change data feed on at both of its ends."""
    if start_exclusive < -1 or end < start_exclusive:
        raise InvalidVersionRange(
            f"change range ({start_exclusive}, {end}] of {uri} is empty or reversed: the start "
            "(exclusive) must be >= -1 and <= the end"
        )
    latest = latest_version(uri, storage_options)
    if end > latest:
        raise HistoryUnavailable(
            f"versions out of range: changes up to version {end} of {uri} were asked for, but "
            f"the table is at version {latest}; ask for a range that ends at or before {latest}"
        )
    dt = open_head(uri, end, storage_options)  # the version the range ends at (no files)
    if not change_feed_enabled(dt.metadata().configuration):
        raise ChangeFeedDisabled(
            f"{uri} has its change data feed off ({CDF_PROPERTY} is not 'true'): enable it "
            f"(ALTER TABLE ... SET TBLPROPERTIES ({CDF_PROPERTY} = true)) and rebuild from a "
            "version written after that"
        )
    if end == start_exclusive:
        return dt
    # the configuration at start + 1 is the one at `end` unless a later version of the range
    # changed the metadata: only then is that version loaded
    first = (open_head(uri, start_exclusive + 1, storage_options)
             if metadata_changed(uri, start_exclusive + 2, end, storage_options, dt) else dt)
    if not change_feed_enabled(first.metadata().configuration):
        raise ChangeFeedDisabled(
            f"{uri} had its change data feed off at version {start_exclusive + 1}: changes "
            f"({start_exclusive}, {end}] cannot be read; start from a version written after "
            f"{CDF_PROPERTY} was set to true"
        )
    return dt


def _normalize_changes(table: pa.Table) -> pa.Table:
    """Plain strings; ``_commit_version`` int64 (delta-rs gives uint64, which Spark has no type
    for); ``_commit_timestamp`` as a UTC timestamp (delta-rs gives naive UTC milliseconds)."""
    fields = []
    for f in normalize_schema(table.schema):
        if f.name == "_commit_version":
            f = pa.field(f.name, pa.int64())
        elif f.name == "_commit_timestamp":
            f = pa.field(f.name, pa.timestamp("us", tz="UTC"))
        fields.append(f)
    target = pa.schema(fields)
    return table if target == table.schema else table.cast(target)


def _empty_changes(dt: DeltaTable, columns: Sequence[str] | None) -> pa.Table:
    schema = arrow_schema(dt)
    fields = list(schema) + [
        pa.field("_change_type", pa.string()),
        pa.field("_commit_version", pa.int64()),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
    if columns is not None:
        by_name = {f.name: f for f in fields}
        fields = [by_name[c] for c in columns]
    return pa.schema(fields).empty_table()
