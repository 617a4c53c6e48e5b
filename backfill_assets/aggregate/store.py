"""An aggregate MV's three Delta tables (group state, kept input, MV), read by touched group
and written through the storage door with an app transaction per table.

Why a key column of its own (`GROUP_KEY`, the group's canonical text, never null): a group whose
columns hold nulls is a group like any other (SQL's GROUP BY), but a key lookup, like any
join, never matches a null; each table is keyed by that text instead (the kept input by it
and the upstream pk), and its rows carry the group columns as they are.

Why one app transaction per table and barrier: an aggregate is not idempotent, so recovery
asks each table whether it holds the barrier (`txn_version`) and brings forward only those
that do not; never "are the rows already there".
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.aggregate import held
from backfill_assets.arrow.aggregate_state import AggregateTables
from backfill_assets.arrow.group_keys import canonical_texts, json_lists, plain_text
from backfill_assets.core.aggregate_definition import GROUP_KEY
from backfill_assets.core.names import VNODE
from backfill_assets.core.vnode import SEPARATOR, canonical_value_text, check_vnode_count
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook

STATE, INPUT, MV = "agg_state", "agg_input", "mv"  # the phases of the app transactions


def group_texts(rows: pa.Table, t: AggregateTables) -> pa.Array:
    """Each row's group key as text: the JSON list of its columns' canonical texts (null as
    JSON null, so a null and an empty string are different groups); a column at a time
    where Arrow gives the same text (arrow/group_keys.py), else a row at a time."""
    types = list(t.plan.group_types)
    texts = [canonical_texts(rows.column(n), ty) for n, ty in zip(t.group_names, types,
                                                                   strict=True)]
    if all(x is not None for x in texts):
        lists = json_lists(texts, rows.num_rows,  # type: ignore[arg-type]
                           [plain_text(ty) for ty in types])
        if lists is not None:
            return lists
    columns = [rows.column(n).to_pylist() for n in t.group_names]
    return pa.array([json.dumps([None if v is None else canonical_value_text(v, ty)
                                 for v, ty in zip(values, types, strict=True)],
                                ensure_ascii=False)
                     for values in zip(*columns, strict=True)] if columns else [], pa.string())


def distinct_groups(changes: pa.Table, t: AggregateTables) -> pa.Table:
    """The group columns of each group ``changes`` touch, once."""
    return changes.select(t.group_names).group_by(t.group_names, use_threads=False
                                                  ).aggregate([])


def group_vnodes(rows: pa.Table, t: AggregateTables) -> list[int]:
    """The distinct vnodes of the groups of ``rows`` (the files a keyed read opens)."""
    return sorted(set(t.group_vnodes(rows).to_pylist()))


def with_key(rows: pa.Table, t: AggregateTables, texts: pa.ChunkedArray | None = None
             ) -> pa.Table:
    """``rows`` (ending with `vnode`) with `GROUP_KEY` just before `vnode`; ``texts``: the
    keys of the same groups in the same order, known already (an MV finished from state
    rows reuses theirs)."""
    texts = group_texts(rows, t) if texts is None else texts
    return rows.add_column(rows.schema.get_field_index(VNODE), GROUP_KEY, texts)


def keyed_state(t: AggregateTables, old: pa.Table, changes: pa.Table) -> pa.Table:
    """The live touched groups' new state rows with `GROUP_KEY` (``old``: their rows as the
    store reads them): an old group's key text carried, only a born group's computed."""
    new = t.state_update(old, changes, carry=(GROUP_KEY,))[0]
    texts = new.column(GROUP_KEY)
    if texts.null_count:
        born = pc.is_null(texts)
        new = new.set_column(new.schema.get_field_index(GROUP_KEY), GROUP_KEY,
                             pc.replace_with_mask(texts.combine_chunks(), born.combine_chunks(),
                                                  group_texts(new.filter(born), t)))
    return new


def _keyed_schema(schema: pa.Schema) -> pa.Schema:
    at = schema.get_field_index(VNODE)
    fields = [f.with_nullable(True) for f in schema]
    return pa.schema([*fields[:at], pa.field(GROUP_KEY, pa.string()), *fields[at:]])


@dataclass(frozen=True)
class Table:
    """One of the three tables: where, its schema (with `GROUP_KEY`), its key, its phase."""

    uri: str
    schema: pa.Schema
    key: tuple[str, ...]
    phase: str
    cdf: bool


@dataclass(frozen=True)
class AggregateStore:
    """The tables of one aggregate MV."""

    name: str
    tables: MVTables
    agg: AggregateTables
    vnode_count: int

    def table(self, phase: str) -> Table:
        pk = tuple(n for n, _ in self.agg.pk)
        return {STATE: Table(self.tables.aggregate_state, _keyed_schema(self.agg.state_schema),
                             (GROUP_KEY,), STATE, False),
                INPUT: Table(self.tables.aggregate_input, _keyed_schema(self.agg.input_schema),
                             (GROUP_KEY, *pk), INPUT, False),
                MV: Table(self.tables.mv, _keyed_schema(self.agg.mv_schema), (GROUP_KEY,),
                          MV, True)}[phase]

    @property
    def phases(self) -> tuple[str, ...]:
        """The tables a barrier writes, in commit order (no kept input when none is kept)."""
        return (STATE, INPUT, MV) if self.agg.kept else (STATE, MV)

    def ensure(self) -> None:
        """Create the missing tables, empty (merge-on-read, keyed by their key columns)."""
        for phase in self.phases:
            t = self.table(phase)
            owned_tables.ensure_data_table(t.uri, t.schema, self.tables.storage_options,
                                           cdf=t.cdf, key_names=list(t.key),
                                           vnode_count=self.vnode_count)

    def txn_version(self, phase: str, vnodes: Sequence[int]) -> int | None:
        """The barrier version the table's last commit for ``vnodes`` holds (the lowest over
        them; None when any has none)."""
        table = owned_tables.open_if_exists(self.table(phase).uri, self.tables.storage_options)
        found = owned_tables.txn_versions(table, self.name, phase, vnodes,
                                          self.tables.storage_options)
        values = list(found.values())
        return None if not values or any(v is None for v in values) else min(values)

    def snapshot(self, phase: str) -> storage.TableVersion:
        """The table's latest version."""
        t, so = self.table(phase), self.tables.storage_options
        return storage.TableVersion(t.uri, so, owned_tables.open_if_exists(t.uri, so))

    def read(self, phase: str, keys: pa.Array | None, vnodes: Sequence[int] | None = None
             ) -> tuple[storage.TableVersion, pa.Table]:
        """The table's latest version and its rows of the groups ``keys`` (all rows when
        None): from the rows this process holds at that version (aggregate/held.py), else
        the whole table read and held when it is small enough, else only the files of those
        groups' vnodes (``vnodes`` when the caller knows them)."""
        t = self.table(phase)
        snap = self.snapshot(phase)
        delta = snap.table
        if keys is not None and len(keys) == 0:
            return snap, t.schema.empty_table()
        whole = held.rows_at(t.uri, table_id(snap), snap.version)
        if whole is None:
            if keys is not None and vnodes is None:
                vnodes = sorted(set(_vnodes_of(keys, self)))
            if held.read_whole(snap.live_rows, None if keys is None else len(vnodes or ()),
                               self.vnode_count):
                whole = owned_tables.read_rows(delta).select(t.schema.names).cast(t.schema)
                held.hold(t.uri, table_id(snap), snap.version, whole)
        if whole is not None:
            return snap, whole if keys is None else held.of_groups(
                t.uri, table_id(snap), snap.version, whole, keys)
        rows = owned_tables.read_rows(delta, vnodes)
        if keys is not None:
            rows = rows.filter(pc.is_in(rows.column(GROUP_KEY), keys))
        return snap, rows.select(t.schema.names).cast(t.schema)

    def write(self, phase: str, snap: storage.TableVersion, before: pa.Table, after: pa.Table,
              version: int, vnodes: Sequence[int], hook: Hook,
              extra: Mapping[str, int] | None = None) -> storage.Applied:
        """One commit of the table: the rows of the changed keys ``before`` -> ``after``
        (a key only before is deleted), carrying the barrier's app transaction. When this
        process holds the whole table at ``snap`` and the barrier covers every vnode, the
        storage layer may rewrite the table from those rows instead of giving its files DVs
        (`storage.apply_keyed`'s ``whole``: a barrier touching a large share of the groups
        meets every file anyway, and its DVs would make a compaction due). ``extra``: more
        app ids the commit carries (a join's dimension versions)."""
        t = self.table(phase)
        whole = held.rows_at(t.uri, table_id(snap), snap.version) \
            if len(set(vnodes)) == self.vnode_count else None
        intent = owned_tables.intent(self.name, phase, vnodes, version, extra=extra)

        def inner(point: str) -> None:
            hook(f"{phase}_{point}")

        read, before = before, before.select(t.schema.names).cast(t.schema)
        after = after.select(t.schema.names).cast(t.schema)
        applied = storage.apply_keyed(snap, list(t.key), intent,
                                      storage.KeyedRows(before, after), whole=whole,
                                      hook=inner)
        if whole is not None and applied.rows is not None \
                and applied.version == snap.version + 1:  # a rewrite: its rows are the table
            held.hold(t.uri, table_id(snap), applied.version, applied.rows.cast(whole.schema))
        else:
            held.committed(t.uri, table_id(snap), snap.version, applied.version, before, after,
                           read)
        return applied

    def compact(self, spark: SparkSession, phase: str,
                committed: tuple[storage.TableVersion, storage.Applied],
                vnodes: Sequence[int]) -> bool:
        """Compaction of the table a barrier committed to, by the row MV's rule: only when
        `storage.compaction_due` says its files passed a threshold (each barrier adds a
        file, and a barrier reads every file of its touched vnodes); whether it ran. Rows
        are kept as they are (no data change, no app transaction), so a crash in it loses
        nothing."""
        if not storage.compaction_due(*committed, vnodes):
            return False
        t = self.table(phase)
        snap = storage.TableVersion.load(t.uri, None, self.tables.storage_options)
        report = storage.compact(spark, snap, list(t.key), vnodes)
        if report.compacted_files:
            held.moved(t.uri, table_id(snap), snap.version, report.version)
        return report.compacted_files > 0


def compact_later(store: AggregateStore, spark: SparkSession, phase: str,
                  committed: tuple[storage.TableVersion, storage.Applied],
                  vnodes: Sequence[int]) -> bool:
    """``store.compact`` of a table a barrier committed to, started in the background when
    `storage.compaction_due` says it is due (whether it was). Why not inline: the barrier's
    MV and progress are committed already, so the MV is current before the compaction runs
    (RisingWave compacts in the background too), and a rewrite of a table's most deleted
    files is the largest single cost of a barrier that touches a quarter of the groups. The
    next barrier of the MV waits for it first (`settle`); a crash in it loses nothing (no
    data change, no app transaction); the interpreter waits for it at exit."""
    if not storage.compaction_due(*committed, vnodes):
        return False
    uri = store.table(phase).uri
    with _COMPACTING_LOCK:
        _COMPACTING[_uri(uri)] = _COMPACTOR.submit(store.compact, spark, phase, committed,
                                                   vnodes)
    return True


def settle(store: AggregateStore) -> None:
    """Wait for the background compactions of the MV's tables (`compact_later`), raising
    what one of them raised."""
    for phase in (STATE, INPUT, MV):
        with _COMPACTING_LOCK:
            running = _COMPACTING.pop(_uri(store.table(phase).uri), None)
        if running is not None:
            running.result()


def _uri(uri: str) -> str:
    return uri.rstrip("/")


_COMPACTING: dict[str, Future] = {}  # table uri -> its compaction running in the background
_COMPACTING_LOCK = threading.Lock()
_COMPACTOR = ThreadPoolExecutor(1, thread_name_prefix="aggregate-compaction")


def table_id(snap: storage.TableVersion) -> str:
    return snap.table.metadata().id


def _vnodes_of(keys: pa.Array, store: AggregateStore) -> list[int]:
    """The vnodes of group keys given as `group_texts`: their values' canonical texts joined
    and hashed as `core.aggregates.group_vnode` hashes a group (a null as the empty text)."""
    check_vnode_count(store.vnode_count)
    return [zlib.crc32(SEPARATOR.join("" if v is None else v for v in json.loads(text))
                       .encode("utf-8")) % store.vnode_count for text in keys.to_pylist()]
