"""A join MV's index tables between checkpoints: a snapshot-mode barrier brings each index
forward in memory and commits it only every few barriers (RisingWave's checkpoint
frequency, as the aggregate's group state: aggregate/checkpoint.py), so most fact barriers
make no commit of the index, the largest table of the MV.

What is held is not the index (as large as the fact table) but its rows changed since the
table's checkpoint: every fact pk a barrier changed since then (``pks``), the index rows the
table holds for them (``before``: their pre-images at the checkpoint) and the rows they have
now (``after``). A read of the index by join key is the table's rows at the checkpoint with
those pks' rows replaced by ``after``'s (`Lag.overlay`); the checkpoint's commit is one
keyed write ``before`` -> ``after``.

Why it stays exactly once: an index row is a function of its fact row alone (the join key,
the pk, the columns the MV reads), so the index at the barrier v is the table at its
checkpoint c plus the fact's change feed over (c, v], netted per pk. The table's app
transaction names c; the MV and the progress are at v >= c. A process that does not hold
the index at v (a new process, a crash, a commit of another process) replays the feed (c, v]
into a new `Lag` (`replayed`) and commits the index at that barrier, as does any process's
first barrier (a sensor's run per barrier would otherwise replay a growing range). An entry
is valid only for the index table's id and version it started from and the barrier it is
at. The keyed commit's refusal of a retracted fact the index never held moves to the
checkpoint's commit with it.

When a checkpoint is due: every CHECKPOINT_BARRIERS barriers, or once CHECKPOINT_ROWS
changed facts are held (the replay a crash costs, and the memory, are then bounded), after a
replay, and at a process's first barrier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.core.errors import JoinStateMismatch
from backfill_assets.join import sources
from backfill_assets.join.store import JoinStore, Pair, index_phase
from backfill_assets.mv.owned_tables import MVTables

CHECKPOINT_BARRIERS = 8  # barriers between two commits of an index, at most
CHECKPOINT_ROWS = 1_000_000  # changed facts held since the checkpoint, at most


@dataclass(frozen=True)
class Lag:
    """One index at barrier ``at``, brought from its table's version ``table_version`` (id
    ``table_id``) by the facts changed since: their pks, the table's rows of them
    (``before``) and their rows now (``after``)."""

    table_id: str
    table_version: int
    at: Pair
    pk: tuple[str, ...]
    pks: pa.Table
    before: pa.Table
    after: pa.Table
    barriers: int

    @property
    def due(self) -> bool:
        """Whether the barrier bringing this index forward commits it."""
        return self.barriers >= CHECKPOINT_BARRIERS or self.pks.num_rows >= CHECKPOINT_ROWS

    def stays_behind(self, changed: pa.Table) -> bool:
        """Whether the barrier changing the facts ``changed`` (their pks) surely leaves
        this index short of its checkpoint (`advanced` then not `due`): what lets the
        barrier commit the MV before this index's changes are brought forward."""
        return self.barriers + 1 < CHECKPOINT_BARRIERS \
            and self.pks.num_rows + changed.num_rows < CHECKPOINT_ROWS

    def overlay(self, rows: pa.Table, keys: pa.Table, on: Sequence[str]) -> pa.Table:
        """The index rows whose join key ``on`` is in ``keys`` at ``at``: the table's
        ``rows`` (read at the checkpoint) but the changed facts', which are ``after``'s."""
        if self.pks.num_rows == 0:
            return rows
        kept = _anti(rows, self.pks, list(self.pk))
        probe = pa.table({k: keys.column(k).cast(self.after.schema.field(k).type)
                          for k in on})
        now = self.after.join(probe, keys=list(on), join_type="left semi", use_threads=False)
        return pa.concat_tables([kept.select(rows.schema.names),
                                 now.select(rows.schema.names).cast(rows.schema)])

    def advanced(self, changed: pa.Table, before: pa.Table, after: pa.Table, to: Pair) -> Lag:
        """The index after a barrier to ``to`` that changed the facts ``changed`` (their
        pks) from the index rows ``before`` (their pre-images) to ``after``."""
        pk = list(self.pk)
        new = _anti(changed.select(pk).cast(self.pks.schema), self.pks, pk)
        first = _anti(before, self.pks, pk)  # a pk seen before keeps the checkpoint's row
        return replace(
            self, at=to, pks=_concat(self.pks, new),
            before=_concat(self.before, first.cast(self.before.schema)),
            after=_concat(_anti(self.after, changed.select(pk), pk),
                          after.cast(self.after.schema)),
            barriers=self.barriers + 1)


def empty(store: JoinStore, i: int, snap: storage.TableVersion, at: Pair,
          barriers: int = 0) -> Lag:
    """Index ``i`` at its table's version ``snap``, which holds ``at``'s rows."""
    jt = store.jt
    pk = list(jt.plan.pk)
    schema = jt.index_schemas[i]
    pk_schema = pa.schema([jt.fact_row_schema.field(k) for k in pk])
    return Lag(table_id(snap), snap.version, at, tuple(pk), pk_schema.empty_table(),
               schema.empty_table(), schema.empty_table(), barriers)


def lags_at(store: JoinStore, tables: MVTables, snaps: Sequence[storage.TableVersion],
            at: Pair) -> tuple[list[Lag], list[int] | None]:
    """Each index at ``at``: as this process holds it, else its table (``snaps``, in the
    plan's order) with the fact feed since its checkpoint replayed, its commit then due;
    and the fact range replayed (None: none)."""
    jt, pk, out, replayed = store.jt, list(store.jt.plan.pk), [], None
    for i, snap in enumerate(snaps):
        lag = current(snap, at)
        if lag is None:
            c = store.held(snap, index_phase(i))
            if c is None or c.fact > at.fact:
                raise JoinStateMismatch(
                    f"join MV {store.name!r}: index {i} holds no barrier at or before its "
                    "progress's: reset the MV to rebuild its state")
            lag = empty(store, i, snap, c, CHECKPOINT_BARRIERS)
            if c.fact < at.fact:  # the fact feed since the checkpoint, into this index
                fc = sources.signed_changes(tables.upstream, c.fact, at.fact,
                                            jt.fact_change_schema, pk,
                                            tables.storage_options, fact=True)
                update = jt.apply([s.empty_table() for s in jt.index_schemas],
                                  [s.empty_table() for s in jt.dimension_schemas], fc,
                                  [s.empty_table() for s in jt.dimension_change_schemas])
                lag = lag.advanced(fc.select(pk), update.index_before[i],
                                   update.index_after[i], at)
                replayed = [c.fact, at.fact]
            lag = replace(lag, at=at, barriers=CHECKPOINT_BARRIERS)
        out.append(lag)
    return out, replayed


def hold_after(store: JoinStore, to: Pair, lagging: dict[str, Lag]) -> None:
    """After a barrier's progress commit: each index it left behind is held at ``to`` (its
    changes since the checkpoint), each it committed (or built) from its new version, a
    checkpoint with nothing changed since."""
    for i in range(store.joins):
        phase = index_phase(i)
        snap = store.snapshot(phase)
        if phase in lagging:
            keep(snap.uri, lagging[phase])
        elif store.held(snap, phase) == to:
            keep(snap.uri, empty(store, i, snap, to))
        else:
            forget(snap.uri)


_LAGS: storage.LRU[str, Lag] = storage.LRU(
    16, name="join index changes held",
    weight=lambda lag: lag.before.nbytes + lag.after.nbytes + lag.pks.nbytes,
    max_weight=512 << 20)


def table_id(snap: storage.TableVersion) -> str:
    return snap.table.metadata().id


def current(snap: storage.TableVersion, at: Pair) -> Lag | None:
    """The index this process holds at ``at``, brought from ``snap`` (the table's latest
    version), or None."""
    known = table_id(snap)
    return _LAGS.get(snap.uri.rstrip("/"), valid=lambda lag: lag.table_id == known
                     and lag.table_version == snap.version and lag.at == at)


def keep(uri: str, lag: Lag) -> None:
    """Hold ``lag`` (its barrier completed)."""
    _LAGS.put(uri.rstrip("/"), lag)


def forget(uri: str) -> None:
    _LAGS.discard_where(lambda k: k == uri.rstrip("/"))


def _anti(rows: pa.Table, keys: pa.Table, pk: list[str]) -> pa.Table:
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows
    probe = pa.table({k: keys.column(k).cast(rows.schema.field(k).type) for k in pk})
    return rows.join(probe, keys=pk, join_type="left anti", use_threads=False) \
        .select(rows.schema.names)


def _concat(a: pa.Table, b: pa.Table) -> pa.Table:
    out = pa.concat_tables([a, b.select(a.schema.names)])
    return out.combine_chunks() if out.column(0).num_chunks > 16 else out
