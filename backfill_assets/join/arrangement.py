"""Arrangement (and no_shuffle) backfill of a join MV (docs/JOINS.md, "Arrangement mode"):
per-vnode positions over the fact table, as the row and aggregate MVs' arrangement mode,
feeding the same join state, MV and commits as the snapshot mode (join/barrier.py).

Each step brings the MV from the join of the fact rows the positions covered at the step
before to the join of the rows its new positions cover, at the new version pair:

1. the fact's change range (v_prev, v_new] netted per key, a key entering only where the
   positions before the step cover it (`chunks.FactReader.visible`);
2. each unfinished vnode's next chunk above its position, read at v_new, as inserts;
3. each dimension's change range (the whole dimension at the first step) as it is: it
   reaches only the facts the index holds, which are the fact rows at or below their vnode's
   position, so a dimension change reaches no row the positions do not cover;
4. all three through `JoinTables.apply` in one go, the commits of the state tables and the
   MV, then the progress with the new positions.

Why a step number in the app transactions: two steps may run at the same version pair (no
side moved while the chunks did), and recovery must tell them apart. Every table's commit
holds (step, dimension versions); the progress commit also holds the fact version
(`store.fact_txn`). Each step's inputs (v_new, dimension versions, chunk limit) are written
(`arrangement_step.json`) before its first commit, so a step some table holds and the
progress does not is redone for the tables behind with the same inputs, read at pinned
versions: never a fact row lost or counted twice.
"""

from __future__ import annotations

import time

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.core.errors import CorruptProgressRow, JoinStateMismatch
from backfill_assets.core.names import VNODE
from backfill_assets.core.positions import PerVnodePositions, SharedPosition
from backfill_assets.core.progress import BackfillState
from backfill_assets.join import sources
from backfill_assets.join.barrier import _Barrier, open_barrier
from backfill_assets.join.chunks import FactReader
from backfill_assets.join.store import PROGRESS, Pair, fact_txn
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import progress_rows, progress_schema, read_progress, refuse_stale
from backfill_assets.step.request import Hook, StepReport
from backfill_assets.storage import TableVersion

MODES = {"arrangement": PerVnodePositions, "no_shuffle": SharedPosition}


def _plan_uri(tables: MVTables) -> str:
    return storage.objects.join(tables.join_state, "arrangement_step.json")


class _Steps:
    """The steps of one join MV in arrangement or no_shuffle mode."""

    def __init__(self, b: _Barrier, strategy: PerVnodePositions | SharedPosition,
                 chunk_size: int):
        self.b, self.strategy, self.chunk_size = b, strategy, chunk_size
        self.key_order = b.upstream.key_order
        so = b.tables.storage_options
        self.facts = FactReader(
            b.spark, b.tables.upstream, pa.schema([f for f in b.upstream.schema
                                                   if f.name != VNODE]),
            b.store.jt.fact_change_schema, self.key_order, b.upstream.key_types,
            b.store.vnode_count, so)

    def done(self) -> Pair | None:
        """(step, dimension versions) the progress holds (None: no step yet)."""
        b = self.b
        snap = TableVersion(b.tables.progress, b.tables.storage_options, b.progress)
        return b.store.held(snap, PROGRESS)

    def state(self) -> tuple[BackfillState, int | None]:
        """The committed positions and the fact version they were taken at."""
        b = self.b
        rows = read_progress(b.progress, self.key_order, b.vnodes)
        versions = {v for _, v in rows.values()}
        if len(versions) > 1:
            raise CorruptProgressRow(
                f"the progress of join MV {b.store.name!r} holds fact versions "
                f"{sorted(versions)}: one step moves every vnode to one version; reset the MV")
        return BackfillState(self.key_order, b.vnodes, rows), \
            (versions.pop() if versions else None)

    def run(self, target: Pair, controls: Controls) -> StepReport:
        """Finish a step a crash left behind, then run one step to ``target``."""
        b, done = self.b, self.done()
        step = done.fact if done is not None else 0
        snaps, held = b._held()
        ahead = [held[p].fact for p in b.phases if held[p] is not None and held[p].fact > step]
        if ahead:
            plan = storage.read_json(_plan_uri(b.tables), b.tables.storage_options) or {}
            if plan.get("step") != max(ahead) or max(ahead) != step + 1:
                raise CorruptProgressRow(
                    f"join MV {b.store.name!r}: tables hold step {max(ahead)} but the "
                    f"progress holds step {step} and the recorded step is {plan.get('step')}; "
                    "the tables were edited by hand: reset the MV")
            b.report.recovered = list(b.vnodes)
            self._step(plan, done, snaps, held)
            done, step = self.done(), step + 1
            snaps, held = b._held()
        state, at = self.state()
        if at is not None and target.fact < at:
            refuse_stale(state, b.vnodes, target.fact, b.tables.mv)
        dims = target.dimensions if done is None else tuple(
            max(t, a) for t, a in zip(target.dimensions, done.dimensions, strict=True))
        if done is None or at is None or target.fact > at or dims != done.dimensions \
                or not state.is_finished():
            limit = self.strategy.chunk_limit(self.chunk_size, controls.rate_limit,
                                              len(state.unfinished_vnodes()))
            plan = {"step": step + 1, "v_new": max(target.fact, at or 0), "dims": list(dims),
                    "limit": limit}
            storage.write_json(_plan_uri(b.tables), plan, b.tables.storage_options)
            self._step(plan, done, snaps, held)
        return self._report()

    def _report(self) -> StepReport:
        b = self.b
        state, at = self.state()
        done = self.done()
        b.report.v_new = at if at is not None else b.report.v_new
        b.report.progress = {v: state.current(v) for v in b.vnodes}
        b.report.versions = {v: at for v in b.vnodes}
        b.report.extra.update(
            join_path="arrangement",
            dimension_versions=list(done.dimensions) if done is not None else [],
            vnodes_finished=sum(1 for v in b.vnodes if state.current(v).finished),
            vnode_count=len(b.vnodes))
        return b.report

    def _step(self, plan: dict, done: Pair | None, snaps: dict[str, TableVersion],
              held: dict[str, Pair | None]) -> None:
        """Step ``plan["step"]``: the visible fact changes, the chunks and the dimension
        changes into the tables behind it (a table holding it already is skipped, its state
        read as before its commit), then the progress."""
        b, step, v_new, limit = self.b, plan["step"], plan["v_new"], plan["limit"]
        to = Pair(step, tuple(plan["dims"]))
        behind = [p for p in b.phases if held[p] is None or held[p].fact < step]
        old = {p: snaps[p] if p in behind else self._before(p, snaps[p], done)
               for p in b.store.phases}
        state, v_prev = self.state()
        b.hook("before_write")
        fc = self._fact_changes(state, v_prev, v_new)
        chunk, read = self.facts.chunk(state, v_new, limit, self.strategy.shared)
        self.strategy.apply_chunk(state, read, limit)
        for v in b.vnodes:
            state.advance_version(v, v_new)
        update, rows = b.apply_changes(pa.concat_tables([fc, chunk]),
                                       self._dimension_changes(done, to), old)
        b.report.snapshot_rows += chunk.num_rows
        b.report.extra.update(chunk_rows=chunk.num_rows, fact_changes=fc.num_rows)
        b.commit_tables(to, behind, snaps, update, rows)
        b.hook("before_progress_commit")
        name, so = b.store.name, b.tables.storage_options
        written = [r for r in progress_rows(state, b.vnodes, v_new, self.key_order)
                   if r is not None]
        owned_tables.overwrite_vnodes(
            b.progress, pa.Table.from_pylist(written, progress_schema(self.key_order)),
            mv_name=name, phase=PROGRESS, vnodes=b.vnodes, version=step, storage_options=so,
            extra=to.txns(name, PROGRESS) | {fact_txn(name): v_new})
        b.hook("after_progress_commit")

    def _fact_changes(self, state: BackfillState, v_prev: int | None, v_new: int) -> pa.Table:
        """The fact's netted change range, only the keys the positions cover."""
        b, jt = self.b, self.b.store.jt
        if v_prev is None or v_new <= v_prev:
            return jt.fact_change_schema.empty_table()
        changes = sources.signed_changes(b.tables.upstream, v_prev, v_new,
                                         jt.fact_change_schema, list(jt.plan.pk),
                                         b.tables.storage_options, fact=True)
        return self.facts.visible(changes, state)

    def _dimension_changes(self, done: Pair | None, to: Pair) -> list[pa.Table]:
        """Each dimension's changes since the step before (its whole rows at the first)."""
        b, so = self.b, self.b.tables.storage_options
        schemas = b.store.jt.dimension_change_schemas
        if done is None:
            return [sources.rows_at(b.spark, s.uri, v, schema, so)
                    for s, v, schema in zip(b.sides, to.dimensions, schemas, strict=True)]
        return [sources.signed_changes(s.uri, a, z, schema, list(s.join.key), so, fact=False)
                for s, a, z, schema in zip(b.sides, done.dimensions, to.dimensions, schemas,
                                           strict=True)]

    def _before(self, phase: str, snap: TableVersion, done: Pair | None) -> TableVersion:
        """A state table that already holds the step, as it was before its commit (one
        commit per step): the state the step's update is computed from."""
        prior = self.b.store.snapshot(phase, snap.table.version() - 1)
        if self.b.store.held(prior, phase) != done:
            raise JoinStateMismatch(
                f"join MV {self.b.store.name!r}: table {phase} holds a step its progress "
                "does not, and its commit before does not hold the progress's step: reset "
                "the MV to rebuild its state")
        return prior


def run(spark: SparkSession, d, tables: MVTables, version: int | None, controls: Controls,
        hook: Hook) -> StepReport:
    """One step of the join MV ``d`` in arrangement or no_shuffle mode."""
    started = time.monotonic()
    b, target = open_barrier(spark, d, tables, version, hook, controls)
    report = _Steps(b, MODES[d.mode](), controls.chunk_size or d.chunk_size).run(target,
                                                                                controls)
    report.seconds = time.monotonic() - started
    return report
