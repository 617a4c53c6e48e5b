"""A join MV's Delta tables (index and dimension per join, the MV), read by key and
written through the storage door, each commit carrying the barrier's version pair.

Why a pair in every commit: a join barrier moves the fact to v_fact and every dimension to
its v_dim, and a table brought forward must say to which pair, since either side may move
alone. The fact version is the app transactions `{mv}/{phase}/{vnode}` (as every MV table's);
each dimension's is one more app id, `{mv}/{phase}/dimension/{i}` (`dimension_txn`).
Recovery asks each table which pair it holds and brings forward only those behind; never
"are the rows already there".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.aggregate.store import Table
from backfill_assets.arrow.join_state import JoinTables, index_columns
from backfill_assets.core.errors import JoinStateLayoutOutdated
from backfill_assets.core.names import VNODE
from backfill_assets.join import held
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook

MV, PROGRESS = "mv", "progress"
# the index tables' layout: 1,024-row groups, so a read of a few keys opens ~1 group per key
# (docs/STORAGE.md, "Keyed reads", has the figures against a read by vnode, and the larger
# files it costs)
KEYED_LAYOUT = {storage.ROW_GROUP_ROWS_PROPERTY: "1024"}


def index_phase(i: int) -> str:
    return f"join_index_{i}"


def dimension_phase(i: int) -> str:
    return f"join_dimension_{i}"


def dimension_txn(mv_name: str, phase: str, i: int) -> str:
    """The app id of join ``i``'s dimension version in a commit of ``phase``."""
    return f"{mv_name}/{phase}/dimension/{i}"


@dataclass(frozen=True)
class Pair:
    """A barrier's versions: the fact's and each dimension's (in the definition's order)."""

    fact: int
    dimensions: tuple[int, ...]

    def txns(self, mv_name: str, phase: str) -> dict[str, int]:
        """The dimension app ids a commit of ``phase`` carries (the fact's are per vnode)."""
        return {dimension_txn(mv_name, phase, i): v for i, v in enumerate(self.dimensions)}


def pair_of(txns: dict[str, int], mv_name: str, phase: str, vnodes: Sequence[int],
            joins: int) -> Pair | None:
    """The pair a table's app transactions hold for ``phase`` (None: not all of it)."""
    facts = [txns.get(owned_tables.txn_id(mv_name, phase, v)) for v in vnodes]
    dims = [txns.get(dimension_txn(mv_name, phase, i)) for i in range(joins)]
    if any(v is None for v in (*facts, *dims)) or len(set(facts)) != 1:
        return None
    return Pair(facts[0], tuple(dims))


@dataclass(frozen=True)
class JoinStore:
    """The tables of one join MV: ``mv_schema`` is the MV's (ending with `vnode`)."""

    name: str
    tables: MVTables
    jt: JoinTables
    mv_schema: pa.Schema
    vnode_count: int

    @property
    def joins(self) -> int:
        return len(self.jt.plan.sides)

    @property
    def phases(self) -> tuple[str, ...]:
        """The state tables a barrier writes, in commit order (the MV's tables follow:
        join/output.py)."""
        return (*(index_phase(i) for i in range(self.joins)),
                *(dimension_phase(i) for i in range(self.joins)))

    def table(self, phase: str) -> Table:
        root, pk, jt = self.tables.join_state, tuple(self.jt.plan.pk), self.jt
        if phase == MV:
            return Table(self.tables.mv, self.mv_schema, pk, MV, True)
        i = int(phase.rsplit("_", 1)[1])
        side = jt.plan.sides[i]
        if phase == index_phase(i):
            return Table(f"{root}/index_{i}", jt.index_schemas[i],
                         tuple(index_columns(side, pk)), phase, False)
        return Table(f"{root}/dimension_{i}", jt.dimension_schemas[i], side.key, phase, False)

    def write_key(self, phase: str) -> list[str]:
        """The columns a keyed commit finds the table's rows by: its key, but for an index
        the fact pk alone, which is unique there too (a fact has one index row per join).
        Why: the storage layer finds held rows of a single integer key by a binary search in
        the file keys it keeps, and a two-column key by a hash join over every kept key of
        every file a change meets, which 20,000 changed facts spread over every vnode make
        the whole index at every fact barrier (docs/JOINS.md, "Measured"). The price: the
        rows a commit writes are clustered by (vnode, pk), so a read by join key opens
        every row group of the touched vnodes in those files (one per barrier, as large as
        its changes; the bulk's files stay sorted by the table's key)."""
        if phase.startswith("join_index_"):
            return list(self.jt.plan.pk)
        return list(self.table(phase).key)

    def ensure(self) -> None:
        """Create the missing state tables, empty (merge-on-read, keyed by their key columns);
        the index tables in small row groups (`KEYED_LAYOUT`), which a dimension barrier
        reads by key. State made by the layout before (a facts table beside index rows
        without the fact columns) is refused: `JoinStateLayoutOutdated`."""
        refuse_old_layout(self.name, self.tables)
        for phase in self.phases:
            t = self.table(phase)
            layout = None if phase.startswith("join_dimension_") else KEYED_LAYOUT
            owned_tables.ensure_data_table(t.uri, _nullable(t.schema),
                                           self.tables.storage_options, cdf=t.cdf,
                                           key_names=list(t.key), vnode_count=self.vnode_count,
                                           layout=layout)

    def snapshot(self, phase: str, version: int | None = None) -> storage.TableVersion:
        """The table at its Delta ``version`` (latest when None)."""
        t, so = self.table(phase), self.tables.storage_options
        return storage.TableVersion(t.uri, so, owned_tables.open_if_exists(t.uri, so, version))

    def held(self, snap: storage.TableVersion, phase: str) -> Pair | None:
        """The pair the table's commits hold at ``snap``."""
        return pair_of(snap.txn_versions, self.name, phase, range(self.vnode_count),
                       self.joins)

    def read(self, snap: storage.TableVersion, phase: str, keys: pa.Table | None,
             by: list[str] | None = None) -> pa.Table:
        """The rows whose ``by`` columns (default: the key) equal a row of ``keys`` (all
        rows when None) at ``snap`` (``by`` holds the columns the table's vnode hashes, or
        all of its key). A table in small row groups is read by key (`storage.rows_of_keys`:
        only the groups whose statistics admit a key); a dimension is held whole in the
        process (join/held.py) unless it is large, then read by the files of the keys'
        vnodes, as an index without the property."""
        t = self.table(phase)
        if keys is not None and keys.num_rows == 0:
            return t.schema.empty_table()
        key = by or list(t.key)
        if phase.startswith("join_dimension_") and (keys is None or held.holds_whole(snap)):
            rows = held.rows_at(snap)
            if rows is None:
                rows = owned_tables.read_rows(snap.table).select(t.schema.names).cast(t.schema)
                held.hold(snap, rows)
            return rows if keys is None else _semi(rows, keys, key)
        if keys is None:
            return owned_tables.read_rows(snap.table).select(t.schema.names).cast(t.schema)
        keys = self.jt.with_vnode(keys.select(key), _hash_key(phase, t, self.jt))
        if storage.ROW_GROUP_ROWS_PROPERTY in snap.configuration:
            return storage.rows_of_keys(snap, key, keys, t.schema.names).cast(t.schema)
        vnodes = sorted(set(keys.column(VNODE).to_pylist()))
        rows = owned_tables.read_rows(snap.table, vnodes).select(t.schema.names).cast(t.schema)
        return _semi(rows, keys, key)

    def write(self, phase: str, snap: storage.TableVersion, before: pa.Table, after: pa.Table,
              pair: Pair, hook: Hook) -> None:
        """One commit of the table: the rows of the changed keys ``before`` -> ``after`` (a
        key only before is deleted), carrying the barrier's pair; a dimension held at
        ``snap`` is brought to the new version. An index's rows are found by the fact pk
        alone (`write_key`)."""
        t = self.table(phase)
        version = keyed_write(self.name, self.vnode_count, t, snap, before, after, pair, hook,
                              self.write_key(phase))
        if phase.startswith("join_dimension_"):
            held.committed(snap, version, t.key, before, after)


def keyed_write(name: str, vnode_count: int, t: Table, snap: storage.TableVersion,
                before: pa.Table, after: pa.Table, pair: Pair, hook: Hook,
                key: Sequence[str] | None = None) -> int | None:
    """One commit of table ``t`` (uri, schema, key, phase) of MV ``name``: the rows of the
    changed keys ``before`` -> ``after`` (keyed by ``key``, default the table's), carrying
    ``pair`` (the fact version per vnode, each dimension's version); the version committed
    (None: nothing changed)."""
    intent = owned_tables.intent(name, t.phase, range(vnode_count), pair.fact,
                                 extra=pair.txns(name, t.phase))

    def inner(point: str) -> None:
        hook(f"{t.phase}_{point}")

    return storage.apply_keyed(snap, list(key or t.key), intent, storage.KeyedRows(
        before.select(t.schema.names).cast(t.schema),
        after.select(t.schema.names).cast(t.schema)), hook=inner).version


def held_by(uri: str, tables: MVTables, name: str, phase: str, vnode_count: int,
            joins: int) -> Pair | None:
    """The pair the latest commits of the table at ``uri`` hold for ``phase``."""
    so = tables.storage_options
    table = owned_tables.open_if_exists(uri, so)
    if table is None:
        return None
    return pair_of(storage.TableVersion(uri, so, table).txn_versions, name, phase,
                   range(vnode_count), joins)


def _semi(rows: pa.Table, keys: pa.Table, key: list[str]) -> pa.Table:
    """The ``rows`` whose ``key`` columns equal a row of ``keys`` (a null matches nothing)."""
    probe = pa.table({k: keys.column(k).cast(rows.schema.field(k).type) for k in key})
    return rows.join(probe, keys=key, join_type="left semi", use_threads=False) \
        .select(rows.schema.names)


def _hash_key(phase: str, t: Table, jt: JoinTables) -> list[str]:
    """The columns a table's vnode hashes: the fact pk (MV), the join key (index:
    its `on` columns, hashed with the dimension key's types), the declared key."""
    if phase.startswith("join_index_"):
        return list(jt.plan.sides[int(phase.rsplit("_", 1)[1])].on)
    return list(t.key)


def refuse_old_layout(name: str, tables: MVTables) -> None:
    """A join MV whose state has a facts table was made by the layout before the index
    carried the fact columns: its index cannot serve a dimension change, so it is refused
    by name, before anything is written, rather than read two ways."""
    uri = storage.objects.join(tables.join_state, "facts")
    if owned_tables.open_if_exists(uri, tables.storage_options) is not None:
        raise JoinStateLayoutOutdated(
            f"join MV {name!r} keeps its state in the layout before this version (a facts "
            "table beside an index of fact keys): reset the MV (reset_mv_job) to rebuild it "
            "in the current layout, where each index row carries the fact columns")


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def fact_txn(mv_name: str) -> str:
    """The app id of the fact version in an arrangement step's progress commit, whose
    per-vnode app ids hold the step number (docs/JOINS.md, "Arrangement mode")."""
    return f"{mv_name}/{PROGRESS}/fact"


def recorded_pair(name: str, tables: MVTables, joins: int, vnode_count: int) -> Pair | None:
    """The pair the MV's progress records (None: no barrier yet): what the oracle recomputes
    the join at, and what a sensor compares with both tables' latest versions."""
    so = tables.storage_options
    table = owned_tables.open_if_exists(tables.progress, so)
    if table is None:
        return None
    txns = storage.TableVersion(tables.progress, so, table).txn_versions
    pair = pair_of(txns, name, PROGRESS, range(vnode_count), joins)
    fact = txns.get(fact_txn(name))
    return pair if pair is None or fact is None else Pair(fact, pair.dimensions)
