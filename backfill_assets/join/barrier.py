"""One barrier of a join MV (docs/JOINS.md, "How it runs"): the whole MV brought from the
version pair its progress records to the barrier's pair (v_fact, v_dim...).

1. recover: each table (index and dimension per join, MV) tells by its app
   transactions which pair it holds; a pair some table holds but the progress does not is a
   barrier a crash interrupted: it is completed first over the same change ranges, its
   update computed from the state as it was before that barrier (a table that already holds
   it is read at its Delta version before its commit), and only the tables behind written;
2. the first barrier is the join at the pair built by Spark, each table read once and every
   table written by Spark tasks (`BULK`, join/bulk.py: what `apply` over empty state with
   every row as +1 would give); a later one reads both change feeds, netted per key, and
   the state rows of the keys they touch in two keyed rounds (`JoinTables.changed_keys`:
   the index rows of the changed dimension keys, which carry their facts' rows;
   `lookup_keys`: the dimension rows): never a scan of the facts (`APPLY`). A changed
   fact's row before is its pre-image in the fact's change feed;
3. commits, each carrying the pair: each index, each dimension, the MV (its rows, or
   the aggregate's tables, from the signed joined rows: join/output.py), then progress,
   by a background thread once the others landed (mv/commit_later.py: the next open of
   the progress table in this process waits for it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets.arrow.join_state import JoinUpdate
from backfill_assets.core.errors import JoinStateMismatch
from backfill_assets.core.progress import BackfillState, Completed
from backfill_assets.join import index_checkpoint, sources
from backfill_assets.join.bulk import BulkBuild, refuse_duplicate_dimension_keys
from backfill_assets.join.index_checkpoint import Lag
from backfill_assets.join.output import Output, output_of
from backfill_assets.join.store import (
    PROGRESS,
    JoinStore,
    Pair,
    dimension_phase,
    index_phase,
)
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import (
    progress_schema,
    read_progress,
    refuse_stale,
    write_progress_later,
)
from backfill_assets.step.preflight import CheckedUpstream, checked_upstream
from backfill_assets.step.request import Hook, StepReport
from backfill_assets.storage import TableVersion

BULK, APPLY = "bulk", "apply"


@dataclass
class _State:
    """The state rows a barrier read (index and dimension rows of its keys)."""

    index: list[pa.Table]
    dimensions: list[pa.Table]
    changed: pa.Table  # the pks of the changed facts
    lags: list[Lag] | None = None  # each index's changes since its checkpoint (snapshot mode)


@dataclass
class _Barrier:
    """One join barrier once both sides are checked and the tables exist."""

    spark: SparkSession
    tables: MVTables
    upstream: CheckedUpstream
    sides: list[sources.Side]
    store: JoinStore
    out: Output
    progress: object  # the progress table (deltalake.DeltaTable)
    hook: Hook
    report: StepReport

    @property
    def vnodes(self) -> tuple[int, ...]:
        return tuple(range(self.store.vnode_count))

    def progress_pair(self) -> Pair | None:
        """The pair the progress records: every fact vnode at one version, and the dimension
        versions its last commit carried (None: no barrier yet)."""
        rows = read_progress(self.progress, self.upstream.key_order, self.vnodes)
        versions = {v for _, v in rows.values()}
        if len(rows) != len(self.vnodes) or len(versions) != 1:
            return None
        snap = TableVersion(self.tables.progress, self.tables.storage_options, self.progress)
        held = self.store.held(snap, PROGRESS)
        return held if held is not None and held.fact == versions.pop() else None

    @property
    def phases(self) -> tuple[str, ...]:
        """Every table a barrier commits, in order: the state tables, then the MV's."""
        return (*self.store.phases, *self.out.phases)

    def _held(self) -> tuple[dict[str, TableVersion], dict[str, Pair | None]]:
        snaps = {p: self.store.snapshot(p) for p in self.store.phases}
        held = {p: self.store.held(s, p) for p, s in snaps.items()}
        return snaps, held | {p: self.out.held(p) for p in self.out.phases}

    def run(self, target: Pair) -> StepReport:
        """Complete a barrier a crash left behind, then bring every table to ``target``."""
        at = self.progress_pair()
        snaps, held = self._held()
        ahead = [p for p in self.phases if held[p] is not None and held[p] != at
                 and not self._lags(p, held[p], at)]
        if ahead:
            pending = held[ahead[0]]
            self.report.recovered = list(self.vnodes)
            self._step(at, pending, snaps, held)
            at = pending
            snaps, held = self._held()
        if at is not None and target.fact < at.fact:
            refuse_stale(self._finished(at.fact), self.vnodes, target.fact, self.tables.mv)
        if at is not None:  # a dimension never goes back: a run pinned before a newer one
            target = Pair(target.fact, tuple(max(t, a) for t, a in
                                             zip(target.dimensions, at.dimensions, strict=True)))
        if at is None or target != at:
            self._step(at, target, snaps, held)
            at = target
        self.report.v_new = at.fact
        self.report.extra["dimension_versions"] = list(at.dimensions)
        self.report.progress = {v: Completed(None, 0) for v in self.vnodes}
        self.report.versions = {v: at.fact for v in self.vnodes}
        return self.report

    def _lags(self, phase: str, held: Pair | None, at: Pair | None) -> bool:
        """Whether a state table holding ``held`` is at ``at`` but for commits it skipped: an
        index behind (the fact feed since its checkpoint brings it there:
        join/index_checkpoint.py), a dimension whose own version is ``at``'s (a barrier
        that did not change it skips its commit)."""
        if held is None or at is None or held.fact > at.fact or any(
                h > a for h, a in zip(held.dimensions, at.dimensions, strict=True)):
            return False
        if phase.startswith("join_index_"):
            return True
        i = int(phase.rsplit("_", 1)[1])
        return phase == dimension_phase(i) and held.dimensions[i] == at.dimensions[i]

    def _finished(self, version: int) -> BackfillState:
        return BackfillState(self.upstream.key_order, self.vnodes, {
            v: (Completed(None, 0), version) for v in self.vnodes})

    def _step(self, at: Pair | None, to: Pair, snaps: dict[str, TableVersion],
              held: dict[str, Pair | None]) -> None:
        """Bring the tables behind ``to`` there from ``at``, then the progress."""
        behind = [p for p in self.phases if held[p] != to]
        old = {p: snaps[p] if p in behind else self._before(p, snaps[p], at)
               for p in self.store.phases}
        self.hook("before_write")
        self.report.extra["join_path"] = BULK if at is None else APPLY
        kept: list[tuple[str, Lag]] = []
        if at is None:
            self._bulk(to, behind)
        else:
            lags, replayed = index_checkpoint.lags_at(
                self.store, self.tables, [old[index_phase(i)] for i in range(self.store.joins)],
                at)
            if replayed:
                self.report.extra["index_replayed"] = replayed
            update, state = self._apply(at, to, old, lags)
            kept = self.commit_tables(to, behind, snaps, update, state)
        # the progress last, in the background: every table above holds the pair already
        # (mv/commit_later.py); the next open of the progress table waits for it
        state = self._finished(to.fact)
        write_progress_later(self.tables.progress, self.progress, state, state.key_order,
                             self.store.name, self.vnodes, to.fact,
                             storage_options=self.tables.storage_options, hook=self.hook,
                             extra=to.txns(self.store.name, PROGRESS))
        index_checkpoint.hold_after(self.store, to, dict(kept))

    def _before(self, phase: str, snap: TableVersion, at: Pair | None) -> TableVersion:
        """A table that already holds the pending barrier, as it was before its commit (one
        commit per barrier): the state the barrier's update is computed from."""
        if at is None:
            return snap  # a bulk barrier starts from empty state (read nothing)
        prior = self.store.snapshot(phase, snap.table.version() - 1)
        if self.store.held(prior, phase) != at and not self._lags(
                phase, self.store.held(prior, phase), at):
            raise JoinStateMismatch(
                f"join MV {self.store.name!r}: table {phase} holds a barrier its progress "
                "does not, and its commit before does not hold the progress's pair: reset "
                "the MV to rebuild its state")
        return prior

    def _bulk(self, to: Pair, behind: list[str]) -> None:
        """The first barrier: every table behind ``to`` built by Spark (join/bulk.py)."""
        self.report.engine = "spark"
        self.report.snapshot_rows = BulkBuild(
            self.spark, self.tables.upstream, self.sides, self.store, self.out, to,
            self.hook).run(behind, self.report.extra)

    def _apply(self, at: Pair, to: Pair, old: dict[str, TableVersion], lags: list[Lag]
               ) -> tuple[JoinUpdate, _State]:
        """Both change feeds over (at, to], and the state rows of the keys they reach."""
        so, jt = self.tables.storage_options, self.store.jt
        pk = list(jt.plan.pk)
        fc = sources.signed_changes(self.tables.upstream, at.fact, to.fact,
                                    jt.fact_change_schema, pk, so, fact=True)
        dcs = [sources.signed_changes(s.uri, a, b, schema, list(s.join.key), so, fact=False)
               for s, a, b, schema in zip(self.sides, at.dimensions, to.dimensions,
                                          jt.dimension_change_schemas, strict=True)]
        return self.apply_changes(fc, dcs, old, lags)

    def apply_changes(self, fc: pa.Table, dcs: list[pa.Table], old: dict[str, TableVersion],
                      lags: list[Lag] | None = None) -> tuple[JoinUpdate, _State]:
        """Signed fact and dimension changes through `JoinTables.apply` over the state rows
        of the keys they reach, read from ``old`` in two keyed rounds (never a scan);
        ``lags``: each index's changes since its table's checkpoint (None: the tables hold
        the barrier before, as an arrangement step's do)."""
        jt, store = self.store.jt, self.store
        _, changed_keys = jt.changed_keys(fc, dcs)
        index = [store.read(old[index_phase(i)], index_phase(i),
                            keys.rename_columns(list(s.on)), by=list(s.on))
                 for i, (s, keys) in enumerate(zip(jt.plan.sides, changed_keys, strict=True))]
        if lags is not None:
            index = [lag.overlay(rows, keys.rename_columns(list(s.on)), list(s.on))
                     for lag, rows, s, keys in zip(lags, index, jt.plan.sides, changed_keys,
                                                   strict=True)]
        facts = jt.reached_facts(index, changed_keys)
        lookups = jt.lookup_keys(facts, fc, changed_keys)
        dims = [store.read(old[dimension_phase(i)], dimension_phase(i), keys)
                for i, keys in enumerate(lookups)]
        self.report.engine = "driver"
        self.report.forwarded_rows = fc.num_rows + sum(c.num_rows for c in dcs)
        self.report.extra.update(fact_changes=fc.num_rows,
                                 dimension_changes=sum(c.num_rows for c in dcs),
                                 facts_reached=facts.num_rows)
        changed = fc.select(list(jt.plan.pk))
        return jt.apply(index, dims, fc, dcs), _State(index, dims, changed, lags)

    def commit_tables(self, to: Pair, behind: list[str], snaps: dict[str, TableVersion],
                      update: JoinUpdate, state: _State) -> list[tuple[str, Lag]]:
        """The commits of the tables behind ``to``: the state tables, then the MV's; the
        indexes whose commit waits for their checkpoint (held once the barrier is done). The
        MV's input (`Output.prepare`: the aggregate's signed input rows, which read no
        table) is computed in a thread while the state tables commit; the commits keep
        their order, so a state commit that refuses (the index not holding a retracted
        fact) still stops the barrier before the MV's first write. A barrier that surely
        commits no state table (snapshot mode: every index left behind its checkpoint,
        every dimension unmoved: most fact barriers) writes the MV's tables in that thread
        instead, beside the indexes' changes brought forward in memory."""
        early = not self._commits_state(to, behind, snaps, update, state)
        with ThreadPoolExecutor(1) as pool:  # its exit waits for the thread
            done = pool.submit(self.out.write, behind, update.joined, to, self.hook) if early \
                else pool.submit(self.out.prepare, update.joined)
            kept = self._write(to, behind, snaps, update, state)
        done.result()
        if not early:
            self.out.write(behind, update.joined, to, self.hook)
        return kept

    def _commits_state(self, to: Pair, behind: list[str], snaps: dict[str, TableVersion],
                       update: JoinUpdate, state: _State) -> bool:
        """Whether `_write` may commit a state table: an index unless its lag surely stays
        short of its checkpoint (`Lag.stays_behind`), a dimension unless its version did not
        move and nothing of it changed (what `_write` skips)."""
        if state.lags is None:
            return True
        for i in range(self.store.joins):
            if index_phase(i) in behind and not state.lags[i].stays_behind(state.changed):
                return True
            held = self.store.held(snaps[dimension_phase(i)], dimension_phase(i))
            if dimension_phase(i) in behind and (
                    held is None or held.dimensions[i] != to.dimensions[i]
                    or update.dimension_upserts[i].num_rows
                    or update.dimension_deletes[i].num_rows):
                return True
        return False

    def _write(self, to: Pair, behind: list[str], snaps: dict[str, TableVersion],
               update: JoinUpdate, state: _State) -> list[tuple[str, Lag]]:
        """The commits of the state tables behind ``to``, in order, each a keyed write of
        the rows it held for the changed keys -> the rows they hold after. With ``lags``
        (snapshot mode) an index commits only when its checkpoint is due (its rows changed
        since the checkpoint), and a dimension whose version did not move is not
        committed (its rows are the barrier's); the indexes left behind are returned."""
        store, writes = self.store, {}
        kept: list[tuple[str, Lag | None]] = []  # None: a dimension not committed
        for i, side in enumerate(store.jt.plan.sides):
            writes[index_phase(i)] = (update.index_before[i], update.index_after[i])
            if state.lags is not None and index_phase(i) in behind:
                lag = state.lags[i].advanced(state.changed, *writes[index_phase(i)], to)
                writes[index_phase(i)] = (lag.before, lag.after)
                if not lag.due:
                    kept.append((index_phase(i), lag))
            key = list(side.key)
            writes[dimension_phase(i)] = (
                _held(state.dimensions[i], update.dimension_upserts[i],
                      update.dimension_deletes[i], key), update.dimension_upserts[i])
            held = store.held(snaps[dimension_phase(i)], dimension_phase(i))
            if state.lags is not None and dimension_phase(i) in behind and held is not None \
                    and held.dimensions[i] == to.dimensions[i] \
                    and not any(w.num_rows for w in writes[dimension_phase(i)]):
                kept.append((dimension_phase(i), None))
        skipped = {p for p, _ in kept}
        for phase in store.phases:
            if phase in behind and phase not in skipped:
                store.write(phase, snaps[phase], *writes[phase], to, self.hook)
                self.hook(f"after_{phase}_commit")
        self.report.extra["joined_changes"] = update.joined.num_rows
        self.report.extra["index_checkpoint"] = not any(
            p.startswith("join_index_") for p in skipped)
        return [(p, lag) for p, lag in kept if lag is not None]


def _held(rows: pa.Table, upserts: pa.Table, deletes: pa.Table, key: list[str]) -> pa.Table:
    """The held ``rows`` of the keys a write changes (upserted or deleted)."""
    keys = pa.concat_tables([upserts.select(key), deletes.select(key).cast(
        upserts.select(key).schema)])
    probe = pa.table({k: keys.column(k).cast(rows.schema.field(k).type) for k in key})
    return rows.join(probe.group_by(key, use_threads=False).aggregate([]), keys=key,
                     join_type="left semi", use_threads=False).select(rows.schema.names)


def open_barrier(spark: SparkSession, d, tables: MVTables, version: int | None,
                 hook: Hook, controls: Controls) -> tuple[_Barrier, Pair]:
    """Check the upstream, every dimension and the definition (Spark's analysis of its
    expressions over the joined rows), then create the missing tables: nothing is written
    before every check passed."""
    upstream = checked_upstream(tables, d, version, joins_served=True)
    fact_types = {f.name: sources._lenient(f) for f in upstream.schema}
    sides, joined = sources.checked_sides(tables, d.joins, fact_types)
    out = output_of(spark, d, tables, upstream, sides, joined)
    store = out.store
    if owned_tables.open_if_exists(tables.progress, tables.storage_options) is None:
        refuse_duplicate_dimension_keys(spark, sides, store)  # the first barrier: before any table
    progress = owned_tables.ensure_table(
        tables.progress, progress_schema(upstream.key_order), tables.storage_options,
        cdf=False, description=upstream.pin(d, store.mv_schema))
    store.ensure()
    out.ensure()
    report = StepReport(upstream.version, tuple(range(d.vnode_count)), controls.chunk_size or 0,
                        engine="driver")
    barrier = _Barrier(spark, tables, upstream, sides, store, out, progress, hook, report)
    return barrier, Pair(upstream.version, tuple(s.version for s in sides))


def run(spark: SparkSession, d, tables: MVTables, version: int | None, controls: Controls,
        hook: Hook) -> StepReport:
    """One join barrier (see the module docstring) with the controls in force."""
    started = time.monotonic()
    barrier, target = open_barrier(spark, d, tables, version, hook, controls)
    report = barrier.run(target)
    report.seconds = time.monotonic() - started
    return report
