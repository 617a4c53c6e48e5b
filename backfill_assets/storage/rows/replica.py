"""The arrangement replica as a log-structured table: base rows, plus appended change rows.

Why. The replica keeps each vnode's rows in key-sorted one-vnode files with exact bounds, so a
chunk reads only the files after its position (``seek``). Kept exact by deletion vectors,
every barrier's changes (spread over all vnodes by a writer) put a DV on more files than
delta-rs readers tolerate (``maintain.MAX_DV_FILES``), and every barrier would rewrite most of
the replica, a cost that grows with the table, not with the change. A barrier should cost
what changed.

How. Base files are written once per vnode, each row tagged ``REPLICA_VERSION`` = the upstream
version it was copied at and ``REPLICA_DELETED`` false. A barrier's replicated changes, netted
per key, are appended as one small ``change-*`` file: the key's row after the barrier, or a
tombstone (``REPLICA_DELETED`` true), tagged with the barrier's version. Nothing is rewritten.
A read ``resolve``s: per key, the rows of its newest version, tombstones dropped. Rows of one
key at one version are all kept, so a pk the upstream holds twice is still seen twice (and
refused by the chunk's key check), never hidden.

A chunk read over-picks base files by the tombstones of its vnodes (``tombstones``): the files
the seek takes then still hold ``limit`` live rows once the deletes are applied, so the first
``limit`` rows after the position are exactly those of the resolved table. Change files are
small and read by the driver each barrier; when they are many, ``merge_changes`` folds them
into one (a ``dataChange: false`` commit).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame

from backfill_assets.core import names
from backfill_assets.core.errors import ConcurrentBackfillRun
from backfill_assets.core.keys import KeyOrder
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.rows.commit import Change, Intent, commit
from backfill_assets.storage.rows.scan import file_rows
from backfill_assets.storage.rows.write import write_files, write_table
from backfill_assets.storage.store import objects

VERSION, DELETED, VNODE = names.REPLICA_VERSION, names.REPLICA_DELETED, names.VNODE
CHANGE_PREFIX = "change"
MAX_CHANGE_FILES = 16  # change files a barrier reads before they are merged into one


def table_schema(data: pa.Schema) -> pa.Schema:
    """The replica's table schema: its data columns and the two version columns."""
    return data.append(pa.field(VERSION, pa.int64())).append(pa.field(DELETED, pa.bool_()))


def with_version_columns(table: DeltaTable) -> DeltaTable:
    """A replica made before the version columns, given them (its rows read as version -1,
    the oldest: it was kept exact by DVs at its transactions' versions, so every change row
    appended since is newer). Returns the table as it now is."""
    if VERSION in [f.name for f in table.schema().fields]:
        return table
    from deltalake.schema import Field, PrimitiveType

    table.alter.add_columns([Field(VERSION, PrimitiveType("long")),
                             Field(DELETED, PrimitiveType("boolean"))])
    table.update_incremental()
    return table


def tagged(rows: pa.Table, version: int, deleted: bool = False) -> pa.Table:
    """``rows`` as replica rows as of ``version``."""
    n = rows.num_rows
    return rows.append_column(VERSION, pa.array(np.full(n, version, np.int64))).append_column(
        DELETED, pa.array(np.full(n, deleted, bool)))


def is_change_file(f: DataFile) -> bool:
    return posixpath.basename(f.path).startswith(f"{CHANGE_PREFIX}-")


def base_files(snap: TableVersion) -> list[DataFile]:
    return [f for f in snap.files if not is_change_file(f)]


def change_files(snap: TableVersion) -> list[DataFile]:
    return [f for f in snap.files if is_change_file(f)]


def change_rows(after: pa.Table, gone: pa.Table, version: int, schema: pa.Schema) -> pa.Table:
    """One barrier's netted changes as replica rows: ``after`` (the keys' rows after it) and
    tombstones for ``gone`` (rows of keys deleted by it: only their key and vnode matter)."""
    data = pa.schema([f for f in schema if f.name not in (VERSION, DELETED)])
    kept = tagged(after.select(data.names).cast(data), version)
    dead = tagged(gone.select(data.names).cast(data), version, deleted=True)
    return pa.concat_tables([kept, dead]).cast(schema)


def append_changes(snap: TableVersion, rows: pa.Table | DataFrame, intent: Intent) -> int:
    """Commit ``rows`` (``change_rows``; a Spark frame of them when many) as change files,
    with ``intent``'s transactions (a barrier with no change still records that the replica
    is at its version). Returns the rows written."""
    if isinstance(rows, pa.Table):
        adds = write_table(rows.sort_by([(VNODE, "ascending")]), snap.uri,
                           snap.storage_options, snap.arrow_schema, prefix=CHANGE_PREFIX,
                           max_rows_per_file=1 << 30)
    else:
        adds = write_files(rows.sortWithinPartitions(VNODE), snap.uri, snap.storage_options,
                           snap.arrow_schema, prefix=CHANGE_PREFIX)
    change = Change(adds=[a for a in adds if a.rows])
    if not change.empty or intent.txns:
        commit(snap, change, intent)
    return sum(a.rows for a in change.adds)


def read_changes(snap: TableVersion, vnodes: Iterable[int] | None = None) -> pa.Table:
    """Every change row of the replica (of ``vnodes`` when given), read on the driver."""
    schema = snap.arrow_schema
    physical = {c: snap.physical_names.get(c, c) for c in schema.names}
    wanted = None if vnodes is None else pa.array(sorted(set(vnodes)), schema.field(VNODE).type)
    tables = []
    for f in change_files(snap):
        deleted = dv.load(snap.uri, f.deletion_vector, snap.storage_options) \
            if f.deletion_vector else None
        rows = file_rows(snap.file_uri(f.path), snap.storage_options, physical, schema,
                         rows=f.num_records, deleted=deleted)
        tables.append(rows if wanted is None
                      else rows.filter(pc.is_in(rows.column(VNODE), value_set=wanted)))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def tombstones(changes: pa.Table) -> dict[int, int]:
    """Tombstones per vnode: how many more base rows a chunk of that vnode must pick."""
    dead = changes.filter(pc.fill_null(changes.column(DELETED), False))
    counts = dead.group_by(VNODE).aggregate([(VNODE, "count")])
    return dict(zip(counts.column(VNODE).to_pylist(), counts.column(f"{VNODE}_count").to_pylist(),
                    strict=True))


def resolve(rows: pa.Table, key_order: KeyOrder, *, keep_tombstones: bool = False) -> pa.Table:
    """Per (vnode, key): the rows of its newest version; tombstones dropped (kept with
    ``keep_tombstones``, to fold change rows into fewer). Null keys are never merged (the
    chunk's key check refuses them). The version columns are kept."""
    n = rows.num_rows
    if not n:
        return rows
    if rows.column(VERSION).null_count:  # rows of a replica from before the version columns
        rows = rows.set_column(rows.schema.get_field_index(VERSION), VERSION,
                               pc.fill_null(rows.column(VERSION), -1))
    order = [(VNODE, "ascending", "at_end"),
             *[(c.name, "descending" if c.descending else "ascending", "at_end")
               for c in key_order.columns], (VERSION, "descending", "at_end")]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    same = np.ones(n, bool)
    same[0] = False
    for name in (VNODE, *key_order.names):
        column = rows.column(name)
        if n > 1:
            eq = pc.fill_null(pc.equal(column.slice(1), column.slice(0, n - 1)), False)
            same[1:] &= eq.to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(~same)
    group = np.cumsum(~same) - 1
    versions = rows.column(VERSION).to_numpy(zero_copy_only=False)
    keep = versions == versions[starts][group]
    if not keep_tombstones:
        keep &= ~pc.fill_null(rows.column(DELETED), False).to_numpy(zero_copy_only=False)
    return rows.filter(pa.array(keep))


def overlay(base: pa.Table, changes: pa.Table, key_order: KeyOrder) -> pa.Table:
    """``base`` rows (of one version per vnode, keys unique unless the upstream repeated one)
    with ``changes`` applied: only the base rows whose (vnode, key) a change row names are
    resolved with them, the rest pass as they are (no sort of everything read)."""
    if not changes.num_rows:
        return base
    keys = list(key_order.names)  # a pk names one row of the table, whatever its vnode
    if len(keys) == 1:
        mask = pc.fill_null(pc.is_in(base.column(keys[0]), value_set=changes.column(keys[0])),
                            False)
    else:
        named = changes.select(keys).group_by(keys, use_threads=False).aggregate([])
        marker = "__bf_replica_named"
        # only rows whose every key column holds a value some change row holds can match:
        # the join then sees those few, not every row read
        maybe = np.ones(base.num_rows, bool)
        for k in keys:
            maybe &= pc.fill_null(pc.is_in(base.column(k), value_set=pc.unique(
                named.column(k))), False).to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(maybe)
        hit = base.select(keys).take(pa.array(rows)).append_column(marker, pa.array(rows))
        hit = hit.join(named, keys=keys, join_type="inner").column(marker)
        flags = np.zeros(base.num_rows, bool)
        flags[hit.to_numpy(zero_copy_only=False)] = True
        mask = pa.array(flags)
    touched = base.filter(mask)
    kept = base.filter(pc.invert(mask))
    return pa.concat_tables([kept, resolve(pa.concat_tables([touched, changes.cast(base.schema)]),
                                           key_order)])


def merge_changes(snap: TableVersion, key_order: KeyOrder, intent: Intent) -> bool:
    """Fold the change files into one when there are more than MAX_CHANGE_FILES (resolved,
    tombstones kept): what a read sees is unchanged. Returns whether it committed (not when
    a concurrent run over other vnodes folded the same files first: its fold holds them)."""
    files = change_files(snap)
    if len(files) <= MAX_CHANGE_FILES:
        return False
    rows = resolve(read_changes(snap), key_order, keep_tombstones=True)
    adds = write_table(rows, snap.uri, snap.storage_options, snap.arrow_schema,
                       prefix=CHANGE_PREFIX, max_rows_per_file=1 << 30)
    try:
        commit(snap, Change(adds=[a for a in adds if a.rows], removes=files,
                            data_change=False), intent)
    except ConcurrentBackfillRun:  # a run over other vnodes folded them first: nothing lost
        for a in adds:
            objects.delete(objects.join(snap.uri, a.path), snap.storage_options)
        return False
    return True


def data_columns(schema: pa.Schema) -> list[str]:
    return [c for c in schema.names if c not in (VERSION, DELETED)]


def split_by_vnode(changes: pa.Table, groups: Sequence[Sequence[int]]
                   ) -> list[pa.Table]:
    """``changes`` cut into the rows of each vnode group (one per read task)."""
    out = []
    for vnodes in groups:
        wanted = pa.array(list(vnodes), changes.schema.field(VNODE).type)
        out.append(changes.filter(pc.is_in(changes.column(VNODE), value_set=wanted)))
    return out


def vnodes_with_changes(changes: pa.Table, vnodes: Mapping[int, object]) -> set[int]:
    present = set(pc.unique(changes.column(VNODE)).to_pylist()) if changes.num_rows else set()
    return {v for v in present if v in vnodes}
