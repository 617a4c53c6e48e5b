"""The Delta tables a backfill owns, and the application transactions of every commit.

- Application transactions (`{mv}/{phase}/{vnode}` -> upstream version) let a step tell what an
  earlier, interrupted step already committed, and make two runs that write the same vnode at
  the same time conflict (the second commit that sets an app id the winner set is refused).
- The MV and the replica are merge-on-read tables of the storage layer (`storage`): data
  commits are `storage.apply_changes` with an `Intent`. The progress table is a small
  merge-on-read table too, one row per vnode, whose rows a barrier replaces with
  `storage.replace_keyed` (`overwrite_vnodes`: one small file per commit).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from backfill_assets.arrow.types import normalize_schema
from backfill_assets.core.errors import ConcurrentBackfillRun, TableNotFound, WarehouseNotWritable
from backfill_assets.mv import commit_later
from backfill_assets.storage import (
    LRU,
    Intent,
    TableVersion,
    arrangement_properties,
    arrow_schema,
    ensure_mor_table,
    latest_version,
    objects,
    replace_keyed,
)

STEP_METADATA_KEY = "backfill.step"


@dataclass(frozen=True)
class MVTables:
    """Where the four tables of one MV live."""

    upstream: str
    replica: str
    progress: str
    mv: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def under(cls, root: str, mv_name: str, upstream: str,
              storage_options: Mapping[str, str] | None = None) -> MVTables:
        """Tables of `mv_name` under the warehouse `root`; `upstream` is a name or a URI."""
        is_uri = "://" in upstream or upstream.startswith("/")
        base = f"{root.rstrip('/')}/{mv_name}"
        return cls(
            upstream=upstream if is_uri else f"{root.rstrip('/')}/{upstream}",
            replica=f"{base}/replicated_state",
            progress=f"{base}/backfill_progress",
            mv=f"{base}/downstream_mv",
            storage_options=dict(storage_options or {}),
        )

    @property
    def aggregate_state(self) -> str:
        """An aggregate MV's group state (docs/AGGREGATES.md); unused by a row MV."""
        return f"{self.root}/aggregate_state"

    @property
    def aggregate_input(self) -> str:
        """An aggregate MV's kept input (min/max, count(DISTINCT), float sums)."""
        return f"{self.root}/aggregate_input"

    @property
    def aggregate_plan(self) -> str:
        """An aggregate MV's folder of its analysed projection (a JSON document: no JVM for
        later barriers)."""
        return f"{self.root}/aggregate_plan"

    @property
    def join_state(self) -> str:
        """A join MV's state tables (facts, index and dimension per join: docs/JOINS.md)."""
        return f"{self.root}/join_state"

    @property
    def root(self) -> str:
        """The folder (or object-store prefix) holding the MV's tables and its small documents:
        runtime controls, follower stop requests, the no-shuffle run layout."""
        return self.mv.rsplit("/", 1)[0]


def txn_id(mv_name: str, phase: str, vnode: int) -> str:
    """The application-transaction id of one phase of one vnode of one MV."""
    return f"{mv_name}/{phase}/{vnode}"


def vnode_in(vnodes: Iterable[int], alias: str = "") -> str:
    """A literal partition predicate: what lets disjoint runs commit side by side."""
    prefix = f"{alias}." if alias else ""
    return f"{prefix}vnode IN ({', '.join(str(v) for v in sorted(vnodes))})"


def open_if_exists(uri: str, storage_options: Mapping[str, str], version: int | None = None
                   ) -> DeltaTable | None:
    """The table at `version` (latest when None), or None when it does not exist yet (where
    `storage.open_table` raises TableNotFound: a backfill's own tables may not exist yet). The
    latest is kept per process and brought forward with `update_incremental` (a barrier
    opens the progress table and the MV about eight times: a fresh load replays the log, a
    warm one only lists the log and stats one file), while the commit file of the version it
    holds is still the one it was loaded from (a table dropped and recreated is loaded afresh).
    A commit of the table this process left to the background (mv/commit_later.py) lands
    first."""
    commit_later.settle(uri)
    if version is None:
        return _latest(uri, storage_options)
    try:
        return DeltaTable(uri, version=version, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return None


# (uri, options) -> (the table, the version it held when kept and that version's commit file
# identity); the lock is held around a whole lookup, which may bring the table forward in
# place (update_incremental)
_LATEST: LRU[tuple, tuple[DeltaTable, int, tuple | None]] = LRU(32, name="latest tables")


def _latest(uri: str, storage_options: Mapping[str, str]) -> DeltaTable | None:
    key = (uri.rstrip("/"), tuple(sorted(dict(storage_options or {}).items())))
    with _LATEST.lock:
        table, held, seen = _LATEST.pop(key) or (None, None, None)
        # the same table while the commit file of the version it was kept at is unchanged
        # (the object may have moved since: a writer brings it over its own commit)
        if table is not None and seen is not None and seen == _commit_identity(held, key):
            try:
                if latest_version(uri, storage_options) != table.version():
                    table.update_incremental()
            except TableNotFound:
                return None
        else:
            try:
                table = DeltaTable(uri, storage_options=dict(storage_options) or None)
            except TableNotFoundError:
                return None
        _LATEST.put(key, (table, table.version(), _commit_identity(table.version(), key)))
        return table


def _commit_identity(version: int, key: tuple) -> tuple | None:
    """Size and mtime of the commit file of ``version`` (None: gone)."""
    try:
        return objects.stat(objects.join(key[0], "_delta_log", f"{version:020d}.json"),
                            dict(key[1]))
    except OSError:
        return None


def ensure_table(uri: str, schema: pa.Schema, storage_options: Mapping[str, str], *,
                 cdf: bool, description: str | None = None) -> DeltaTable:
    """Open the progress table, creating it empty when missing: a merge-on-read table of one
    row per vnode (not partitioned: a barrier's progress commit then writes one small file,
    not one per vnode). A progress table partitioned by vnode (the platform's earlier layout,
    still readable) is kept as it is: re-laying it out would be a write no barrier needs."""
    table = open_if_exists(uri, storage_options)
    if table is not None and ("vnode" in table.metadata().partition_columns
                              or "deletionVectors" in (table.protocol().reader_features or [])):
        return table
    # missing, or just created by a racing run that has not enabled DVs yet: a commit planned
    # on that version 0 would meet the protocol commit and fail as a concurrent change
    if "://" not in uri and table is None:
        _check_writable(uri)
    return ensure_mor_table(uri, schema, storage_options, cdf=cdf, description=description)


def _check_writable(path: str) -> None:
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent) or "."
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK) or not _can_create(parent):
        raise WarehouseNotWritable(
            f"cannot create {path}: {parent} is not writable; point BACKFILL_WAREHOUSE at a "
            "folder this user can write, or fix its permissions"
        )


def _can_create(folder: str) -> bool:
    """A real probe (permission bits do not stop root; read-only mounts stop everyone)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def txn_versions(table: DeltaTable | None, mv_name: str, phase: str,
                 vnodes: Iterable[int], storage_options: Mapping[str, str] | None = None
                 ) -> dict[int, int | None]:
    """Per vnode, the upstream version the last commit of `phase` was made at: every app id
    from one replay of the log (`storage.TableVersion.txn_versions`, incremental in a warm
    process) instead of one delta-rs lookup per vnode (a cost per vnode, 256 by default). A remote
    table without its storage options is asked through delta-rs."""
    if table is None:
        return {v: None for v in vnodes}
    uri = _local(table.table_uri)
    if storage_options is None and not objects.is_local(uri):
        return {v: table.transaction_version(txn_id(mv_name, phase, v)) for v in vnodes}
    txns = TableVersion(uri, dict(storage_options or {}), table).txn_versions
    return {v: txns.get(txn_id(mv_name, phase, v)) for v in vnodes}


def intent(mv_name: str, phase: str, vnodes: Sequence[int], version: int,
           metadata: Mapping[str, str] | None = None,
           extra: Mapping[str, int] | None = None) -> Intent:
    """What a storage-layer commit of `phase` for `vnodes` at upstream `version` carries;
    ``extra``: more app ids (a join MV's dimension versions: its barrier is a version pair)."""
    return Intent({**{txn_id(mv_name, phase, v): version for v in vnodes}, **dict(extra or {})},
                  dict(metadata or {}))


def ensure_data_table(uri: str, schema: pa.Schema, storage_options: Mapping[str, str], *,
                      cdf: bool, key_names: Sequence[str], vnode_count: int,
                      layout: Mapping[str, str] | None = None) -> DeltaTable:
    """The MV or the replica (merge-on-read, created when missing), recording its primary key
    and vnode count like a platform upstream, so another MV can be built on it; ``layout``:
    storage layout properties fixed at creation (the replica's ``backfill.seekFileRows``)."""
    table = open_if_exists(uri, storage_options)
    if table is not None and "deletionVectors" in (table.protocol().reader_features or []):
        return table
    if "://" not in uri:
        _check_writable(uri)
    config = {**arrangement_properties(key_names, vnode_count), **dict(layout or {})}
    return ensure_mor_table(uri, schema, storage_options, cdf=cdf, configuration=config)


def commit_properties(mv_name: str, phase: str, vnodes: Sequence[int], version: int,
                      metadata: Mapping[str, str] | None = None) -> CommitProperties:
    txns = [Transaction(txn_id(mv_name, phase, v), version) for v in vnodes]
    # delta-rs retries a commit that lost the race for the next table version only after its
    # conflict checker cleared it: a winner that set one of these app ids or touched these
    # partitions still fails it; runs over disjoint vnodes both commit (with 0 retries they
    # did not: any two commits at the same moment failed one of them)
    return CommitProperties(app_transactions=txns, custom_metadata=dict(metadata or {}))


def overwrite_vnodes(table: DeltaTable, rows: pa.Table, *, mv_name: str, phase: str,
                     vnodes: Sequence[int], version: int,
                     storage_options: Mapping[str, str] | None = None,
                     extra: Mapping[str, int] | None = None) -> int:
    """Replace the rows of `vnodes` in `table` with `rows` in one commit (app transactions
    `{mv}/{phase}/{vnode}` at `version`, and ``extra``'s); the new table version."""
    if "vnode" not in table.metadata().partition_columns:
        snap = TableVersion(_local(table.table_uri), dict(storage_options or {}), table)
        keys = pa.table({"vnode": pa.array(sorted(vnodes), rows.schema.field("vnode").type)})
        # a progress commit is not fsynced: the MV commit before it carries the same
        # progress (recovery completes a lost progress commit from it)
        done = replace_keyed(snap, ["vnode"], replace(intent(mv_name, phase, vnodes, version,
                                                             extra=extra),
                                                      durable=phase != "progress"), keys, rows)
        table.update_incremental()  # like a delta-rs write: the object sees its own commit
        return done.version if done.version is not None else table.version()
    # a vnode-partitioned progress table (the earlier layout): its vnodes' partitions overwritten
    props = commit_properties(mv_name, phase, vnodes, version)
    try:
        write_deltalake(table, rows.cast(arrow_schema(table)), mode="overwrite",
                        predicate=vnode_in(vnodes), commit_properties=props)
    except CommitFailedError as exc:
        raise ConcurrentBackfillRun(
            f"another run wrote {table.table_uri} for vnodes {_span(vnodes)} at the same time "
            f"({exc}); rerun, and give concurrent runs disjoint vnode ranges"
        ) from exc
    return table.version()


def _local(uri: str) -> str:
    """delta-rs' ``file://`` URI of a local table as the path the storage layer uses."""
    uri = uri.rstrip("/")
    return unquote(objects.local_path(uri)) if uri.lower().startswith("file://") else uri


def read_rows(table: DeltaTable, vnodes: Iterable[int] | None = None,
              columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of `table` (optionally of some vnodes) as plain Arrow types, via `scan`."""
    predicate = vnode_in(vnodes) if vnodes is not None else None
    reader = table.scan(columns=list(columns) if columns else None, predicate=predicate)
    rows = pa.table(reader)
    return rows.cast(normalize_schema(rows.schema))


def step_metadata(table: DeltaTable, txn_version: int, vnode: int) -> dict | None:
    """The progress the newest commit for `vnode` at `txn_version` recorded (None: no commit
    in the table's whole history carries it)."""
    return find_steps(table, {vnode: txn_version}).get(vnode)


def find_steps(table: DeltaTable, wanted: Mapping[int, int], first_page: int = 16
               ) -> dict[int, dict]:
    """Per vnode, the step metadata of the newest commit that recorded it at `wanted[vnode]`
    (its app-transaction version). Pages backwards through the whole history (pages of 16,
    64, 256, ... commits) until every vnode is found or the history is exhausted: however
    many commits other vnode ranges made since, a step's progress is found. Usually the
    first page holds it; a long search only happens when recovering an old crash."""
    found: dict[int, dict] = {}
    limit, seen = first_page, 0
    while wanted and len(found) < len(wanted):
        commits = table.history(limit)
        for commit in commits[seen:]:  # newest first; the previous pages are a prefix
            raw = commit.get(STEP_METADATA_KEY)
            if not raw:
                continue
            step = json.loads(raw)
            for vnode, version in wanted.items():
                if vnode not in found and step["version"] == version \
                        and str(vnode) in step["progress"]:
                    found[vnode] = step
        if len(commits) < limit:
            break  # the whole history was read
        seen, limit = len(commits), limit * 4
    return found


def _span(vnodes: Sequence[int]) -> str:
    ordered = sorted(vnodes)
    return f"{ordered[0]}..{ordered[-1]}" if ordered else "(none)"
