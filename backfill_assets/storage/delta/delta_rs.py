"""deltalake (delta-rs) adapter: create tables, read versions and the change data feed.

Thin on purpose: no policy, only translation between delta-rs and the platform (named errors,
plain Arrow types). Never calls ``to_pyarrow_table()`` / ``to_pyarrow_dataset()`` with the
default filesystem (they can abort the process at exit): reads go through ``scan()`` and
``load_cdf()``.

What delta-rs 1.6 does that callers must know (measured, see tests/test_change_feed.py):
- ``load_cdf`` on a table whose change data feed is *off* does not fail: it reports every file
  a merge/update/delete rewrote as deletes + inserts of all its rows. We check
  ``delta.enableChangeDataFeed`` ourselves (at both ends of the range).
- A range that reaches a vacuumed file fails only when the reader is consumed, as
  ``pyarrow.ArrowInvalid`` "... Object at location ... not found"; a start version past the end
  of the log is ``DeltaError`` "Invalid table version: N"; an *end* version past the end of the
  log is silently clamped; a version whose log JSON was cleaned up makes ``DeltaTable(uri,
  version=v)`` raise ``TableNotFoundError``. All of these become HistoryUnavailable here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from backfill_assets.arrow.types import normalize_schema
from backfill_assets.core.errors import (
    HistoryUnavailable,
    TableNotFound,
)
from backfill_assets.core.names import VNODE
from backfill_assets.storage.store import conditional, objects
from backfill_assets.storage.store.lru import LRU

CDF_PROPERTY = "delta.enableChangeDataFeed"
PK_PROPERTY = "backfill.primaryKey"  # JSON list of the primary-key columns
VNODE_COUNT_PROPERTY = "backfill.vnodeCount"
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")

StorageOptions = Mapping[str, str] | None


def arrangement_properties(primary_key: Sequence[str], vnode_count: int) -> dict[str, str]:
    """The table configuration that says "arranged by the platform's vnodes of this pk"
    (platform upstreams and MVs; what no_shuffle mode checks)."""
    return {PK_PROPERTY: json.dumps(list(primary_key)), VNODE_COUNT_PROPERTY: str(vnode_count)}


def _opts(storage_options: StorageOptions) -> dict[str, str] | None:
    return dict(storage_options) if storage_options else None


def open_table(uri: str, version: int | None = None,
               storage_options: StorageOptions = None) -> DeltaTable:
    """The Delta table at ``uri`` (at ``version`` if given); TableNotFound / HistoryUnavailable
    instead of delta-rs errors. A pinned version is loaded once per process (`_pinned`):
    a barrier opens the upstream at its version half a dozen times, each a full log load.
    Callers must not write through a table opened at a version."""
    if version is not None:
        return _pinned(uri, version, storage_options)
    return _load(uri, None, storage_options)


def _pinned(uri: str, version: int, storage_options: StorageOptions) -> DeltaTable:
    """A version of a table is immutable, as long as it is the same table: the cache key
    holds the size and modification time of that version's commit file, so a table dropped
    and recreated at the same uri is loaded afresh."""

    try:
        info = objects.stat(objects.join(uri, "_delta_log", f"{version:020d}.json"),
                            storage_options)
    except OSError:
        info = None
    if info is None:  # the commit file is gone (log cleanup): no identity to key on
        return _load(uri, version, storage_options)
    key = (uri.rstrip("/"), version, tuple(sorted((storage_options or {}).items())), info)
    known = _PINNED.get(key)
    if known is not None:
        return known[0]
    table = _load(uri, version, storage_options)
    _PINNED.put(key, (table, pa.table(table.get_add_actions(flatten=False)).num_rows))
    return table


# (uri, version, options, commit file identity) -> (table, its live files), least recently
# used first out: delta-rs keeps a few KB per live file of a loaded version (tens of MiB for a
# table of many thousand files), so the cache is bounded by files as well as by tables
_PINNED_KEPT = 16
_PINNED_FILES = 10_000
_PINNED: LRU[tuple, tuple[DeltaTable, int]] = LRU(
    _PINNED_KEPT, name="pinned delta-rs tables", weight=lambda pinned: pinned[1],
    max_weight=_PINNED_FILES, keep_at_least=2)


def _load(uri: str, version: int | None, storage_options: StorageOptions) -> DeltaTable:
    try:
        return DeltaTable(uri, version=version, storage_options=_opts(storage_options))
    except TableNotFoundError:
        if version is not None and table_exists(uri, storage_options):
            # delta-rs says "not found" for a version whose log was cleaned up
            raise HistoryUnavailable(
                f"version {version} of {uri} is no longer in the table's log (log retention "
                "cleaned it up): use a later version or rebuild from the latest"
            ) from None
        raise TableNotFound(
            f"no Delta table at {uri}: create it first (e.g. run upstream_load_job) or fix the URI"
        ) from None
    except DeltaError as exc:
        if version is not None and is_missing_history(exc):
            raise HistoryUnavailable(
                f"version {version} of {uri} cannot be loaded ({first_line(exc)}): its log or "
                "files are gone (log retention / vacuum); use a later version or rebuild"
            ) from None
        raise


def table_exists(uri: str, storage_options: StorageOptions = None) -> bool:
    return DeltaTable.is_deltatable(uri, storage_options=_opts(storage_options))


def create_table(
    uri: str,
    schema: pa.Schema,
    partition_by: Sequence[str] | None = None,
    *,
    cdf: bool,
    name: str | None = None,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
    storage_options: StorageOptions = None,
    mode: str = "error",
) -> DeltaTable:
    """Create an empty Delta table (version 0).

    ``metadata`` goes into the table configuration (keys outside ``delta.*`` are allowed and
    kept by every later commit), which is how the platform records e.g. the primary key.
    """
    check_commits_safe(uri, storage_options)
    configuration: dict[str, str | None] = {CDF_PROPERTY: "true" if cdf else "false"}
    configuration.update(metadata or {})
    return DeltaTable.create(
        uri,
        schema,
        mode=mode,  # type: ignore[arg-type]
        partition_by=list(partition_by or []) or None,
        name=name,
        description=description,
        configuration=configuration,
        storage_options=_opts(storage_options),
        raise_if_key_not_exists=False,
    )


def check_commits_safe(uri: str, storage_options: StorageOptions = None) -> None:
    """Before writing to an object store: refuse one that ignores conditional writes
    (ConditionalWritesUnsupported; probed once per store and process, nothing for a folder)."""

    conditional.check_conditional_writes(uri, storage_options)


def latest_version(uri: str, storage_options: StorageOptions = None) -> int:
    """The table's latest committed version: the newest commit file in its log (one listing;
    loading the table replays its whole log). Commit files are published whole
    (put-if-absent), so the newest one is committed."""

    names = objects.list_names(objects.join(uri, "_delta_log"), storage_options)
    versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json")
                and n[:20].isdigit()]
    if not versions:  # no table (a named error), or a log this listing does not understand
        return open_table(uri, storage_options=storage_options).version()
    return max(versions)


def table_configuration(uri: str, version: int | None = None,
                        storage_options: StorageOptions = None) -> dict[str, str]:
    return dict(open_table(uri, version, storage_options).metadata().configuration)


def arrow_schema(dt: DeltaTable) -> pa.Schema:
    """The table's schema as plain pyarrow types."""
    return normalize_schema(pa.schema(dt.schema().to_arrow()))


def column_mapping(table) -> str:
    """The table's column mapping mode (``none``, ``name`` or ``id``) from its configuration
    (a ``DeltaTable`` or a log head)."""
    return (table.metadata().configuration.get("delta.columnMapping.mode") or "none").lower()


def column_identities(table) -> dict[str, tuple[int | None, str]]:
    """Each top-level column's identity: (``delta.columnMapping.id``, the physical name its
    data files use). Why: under column mapping a name is only a label; RENAME COLUMN moves it
    to another column and DROP + ADD gives a new column the old name, and only the identity
    tells. Without column mapping a column's identity is its name (no id)."""
    fields = json.loads(table.schema().to_json())["fields"]
    if column_mapping(table) == "none":
        return {f["name"]: (None, f["name"]) for f in fields}
    out = {}
    for f in fields:
        meta = f.get("metadata") or {}
        fid = meta.get("delta.columnMapping.id")
        out[f["name"]] = (None if fid is None else int(fid),
                          meta.get("delta.columnMapping.physicalName", f["name"]))
    return out


def partition_columns(dt: DeltaTable) -> list[str]:
    return list(dt.metadata().partition_columns)


def vnode_predicate(vnodes: Iterable[int], column: str = VNODE) -> str:
    """``vnode IN (1, 2, 3)`` with literal values (prunes partitions, keeps merges of disjoint
    vnode sets from conflicting)."""
    values = sorted({int(v) for v in vnodes})
    if not values:
        return "FALSE"
    return f"{column} IN ({', '.join(str(v) for v in values)})"


def read_table(uri: str, version: int | None = None, columns: Sequence[str] | None = None,
               predicate: str | None = None, storage_options: StorageOptions = None) -> pa.Table:
    """Rows of a version as an Arrow table (via ``scan``; plain string types)."""
    dt = open_table(uri, version, storage_options)
    reader = dt.scan(columns=list(columns) if columns is not None else None, predicate=predicate)
    table = pa.table(reader)
    return _normalize(table)


def _normalize(table: pa.Table) -> pa.Table:
    target = normalize_schema(table.schema)
    return table if target == table.schema else table.cast(target)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_missing_history(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(
        s in text
        for s in ("not found", "no such file", "invalid table version", "version not found",
                  "log segment", "logsegment")
    )


def change_feed_enabled(configuration: Mapping[str, str | None]) -> bool:
    return str(configuration.get(CDF_PROPERTY) or "false").strip().lower() == "true"


def commit_properties(custom_metadata: Mapping[str, Any] | None) -> CommitProperties | None:
    return CommitProperties(custom_metadata=dict(custom_metadata)) if custom_metadata else None


def vnodes_for(table: pa.Table, key_columns: Sequence[Any], vnode_count: int) -> pa.Array:
    """The vnode of every row of ``table`` (int32), by the stable hash of its key columns
    (``KeyColumn``-like objects with ``.name`` and ``.type``). A Python loop, ~1M rows/s."""
    from backfill_assets.core.vnode import vnodes_of

    names = [k.name for k in key_columns]
    types = [k.type for k in key_columns]
    columns = [table.column(n).to_pylist() for n in names]
    return pa.array(vnodes_of(list(zip(*columns, strict=True)), types, vnode_count), pa.int32())
