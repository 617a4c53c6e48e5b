"""The one step loop: one barrier (v_prev -> v_new) for a set of vnodes, in every mode.

1. recover each vnode's progress (finishing a half-done earlier step from its MV commit);
2. replicate the change chunk into the snapshot side (arrangement) — `SnapshotSource.prepare`;
3. forward the netted changes each vnode's position already covers;
4. read the next snapshot chunk after each position (bounded by chunk size and rate limit);
5. commit the MV (forwarded changes + chunk, one atomic commit carrying the new progress),
   then the progress table.
Modes differ only by what the request's `Mode` holds (step/modes/): the snapshot source and the
position strategy (core/positions.py, core/snapshot.py: a bulk strategy reads each vnode's
remainder whole, without a sort, in step/bulk_read.py); kill points (`hook`) sit on every
commit boundary for the crash tests.

A step whose change rows are few (`keyed_barrier`) keeps them on the driver: they are netted
in Arrow (`arrow.netting`), the visible ones projected in one small Spark job, and merged on
read by key lookups (`storage.apply_keyed`, with the chunk's Spark-written rows in the same commit)
instead of a Spark merge that reads every column of every file a changed key may be in (for
changes spread over all vnodes, the whole MV). The snapshot chunk, which can be large, stays in
Spark and lands in the same MV commit. A small barrier (finished vnodes only) then runs no other
Spark job: it costs what changed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.arrow import netting
from backfill_assets.core.names import BAD_KEY, KEEP, ROW_NUMBER
from backfill_assets.core.planning import StepPlan, plan_step
from backfill_assets.core.positions import PositionStrategy
from backfill_assets.core.progress import BackfillState, Completed, NotStarted
from backfill_assets.engine.projection import validate_expressions
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import STEP_METADATA_KEY
from backfill_assets.mv.recovery import (
    progress_rows,
    progress_schema,
    recover_state,
    refuse_stale,
    remember_step,
    step_json,
    unfinished_vnodes,
    write_progress,
)
from backfill_assets.mv.run_layout import check_run_layout
from backfill_assets.step import heap
from backfill_assets.step.bulk_read import replacing
from backfill_assets.step.chunk import (
    Chunk,
    bulk_chunk,
    check_fresh_keys,
    first_chunk,
    mv_file_rows,
    snapshot_chunk,
    upstream_at,
)
from backfill_assets.step.forward import (
    change_rows,
    forwarded,
    forwarded_keyed,
    in_spark,
    on_driver,
)
from backfill_assets.step.key_checks import check_inserted_keys, check_inserted_keys_local
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.step.request import Hook, StepReport, StepRequest, no_hook
from backfill_assets.step.source_context import SnapshotSource, SourceContext

SMALL_BARRIER_ROWS = 1_000_000  # change rows up to which a step keeps them on the driver


def run_step(spark: SparkSession, req: StepRequest, hook: Hook = no_hook) -> StepReport:
    """Run one barrier for `req.vnodes`; see the module docstring for the phases."""
    heap.step_starting()
    step = _Step.open(spark, req, hook)
    hook("before_write")
    raw = change_rows(step.ctx, step.plan)
    if keyed_barrier(raw, step.replay or bool(req.reset)):
        return step.run(on_driver(step.ctx, step.plan, raw))
    changes = in_spark(step.ctx, step.plan, raw)
    try:
        return step.run(changes)
    finally:
        if changes is not None:
            changes.unpersist()


def keyed_barrier(raw: pa.Table | None, special: bool) -> bool:
    """Whether the step's change rows stay on the driver (netted in Arrow, applied by key
    lookups): at most `SMALL_BARRIER_ROWS` of them, and not a replay or a re-snapshot (those
    take the Spark merge, which `step.bulk_read.replacing` builds on)."""
    return raw is not None and raw.num_rows <= SMALL_BARRIER_ROWS and not special


@dataclass
class _Step:
    """Everything one step knows once recovery and planning are done (nothing written yet)."""

    req: StepRequest
    ctx: SourceContext
    plan: StepPlan
    state: BackfillState
    strategy: PositionStrategy
    mv: DeltaTable
    progress_table: DeltaTable
    mv_schema: pa.Schema
    report: StepReport
    hook: Hook
    started: float
    replay: bool = False  # this very barrier's MV commit landed, only its progress is missing
    mv_version: int | None = None  # the MV's version after this step's first commit
    committed: tuple[storage.TableVersion, storage.Applied] | None = None  # its last MV commit
    carried_rows: list[dict | None] | None = None  # the progress rows that commit carries

    @classmethod
    def open(cls, spark: SparkSession, req: StepRequest, hook: Hook) -> _Step:
        """Check the upstream and the definition, recover progress, plan: all before writing."""
        started = time.monotonic()
        d, so = req.definition, req.tables.storage_options
        upstream = checked_upstream(req.tables, d, req.v_new, req.mode.check_upstream)
        key_order = upstream.key_order
        mv_schema = validate_expressions(spark, d, upstream.schema, upstream.mv_schema)
        mv = owned_tables.ensure_data_table(req.tables.mv, mv_schema, so, cdf=True,
                                        key_names=key_order.names, vnode_count=d.vnode_count)
        pin = upstream.pin(d, mv_schema)
        progress_table = owned_tables.ensure_table(req.tables.progress, progress_schema(key_order),
                                               so, cdf=False, description=pin)
        vnodes = tuple(sorted(req.vnodes))
        strategy = req.mode.positions()
        if req.mode.shares_position:
            check_run_layout(req.tables.root, vnodes,
                             lambda group: unfinished_vnodes(progress_table, key_order, group), so)
        state, recovered = recover_state(d.name, key_order, vnodes, progress_table, mv, so)
        if req.reset:  # re-snapshot: start these vnodes again (their MV rows get replaced)
            state, recovered = BackfillState(key_order, vnodes, {
                v: (state.committed(v), state.version(v)) for v in vnodes
                if v not in req.reset and not isinstance(state.committed(v), NotStarted)}), []
        strategy.recover(state)
        refuse_stale(state, vnodes, upstream.version, req.tables.mv)
        replica = owned_tables.open_if_exists(req.tables.replica, so)
        replica_versions = owned_tables.txn_versions(replica, d.name, "replica", vnodes, so)
        plan = plan_step(state, strategy, vnodes, replica_versions, upstream.version,
                         req.chunk_size, req.rate_limit)
        ctx = SourceContext(spark, d.name, req.tables, key_order.names, upstream.key_types,
                            d.vnode_count, upstream.schema, plan.v_new, plan.chunk_limit,
                            key_order)
        report = StepReport(plan.v_new, vnodes, plan.chunk_limit, recovered=recovered)
        # a rerun of a barrier killed between its MV and progress commits completes that
        # barrier (progress commit only) instead of stepping twice at the same version; at
        # an idle barrier (the version did not move) a vnode finished before it moved nothing
        # and is not among the recovered, so it does not count against the replay
        replay = bool(recovered) and all(state.version(v) == plan.v_new for v in vnodes) and \
            all(v in recovered or isinstance(state.committed(v), Completed) for v in vnodes)
        return cls(req, ctx, plan, state, strategy, mv, progress_table, mv_schema,
                   report, hook, started, replay)

    def run(self, changes: DataFrame | pa.Table | None) -> StepReport:
        """Replicate, forward, read the snapshot chunk, commit the MV, commit progress.
        ``changes``: the step's change rows in Spark, or few of them on the driver (Arrow,
        `step.forward.on_driver`), or None."""
        d, plan, state, report = self.req.definition, self.plan, self.state, self.report
        source = self.req.mode.source
        replicate = {p.vnode: p.replicate_from for p in plan.vnodes if p.replicate}
        fresh = [v for v in report.vnodes if isinstance(state.current(v), NotStarted)]
        if not source.checks_keys:
            check_fresh_keys(self.ctx, fresh)
        self._check_inserted(changes, [v for v in report.vnodes if v not in fresh])
        if not self.replay and not self.req.reset:
            self.ctx.first_chunk = first_chunk(self.ctx, source, d, plan, self._mv_version(),
                                               fresh)
        report.replicated_rows = source.prepare(self.ctx, replicate, changes, self.hook)
        keyed = isinstance(changes, pa.Table)
        if keyed:
            forward, report.forwarded_rows = forwarded_keyed(self.ctx, changes, state, plan, d)
        else:
            forward = forwarded(changes, state, plan, d)
        chunk = Chunk(None, 0, {})
        committed = False
        # the forwarded changes alone, positions as they were: only a step that reads
        # snapshot rows can commit twice (a small barrier of finished vnodes does not)
        before = self._mv_intent(final=False) if any(p.read_table_version for p in plan.vnodes) \
            else None
        try:
            if not self.replay:
                chunk = self._read_chunk(source, fresh)
                self.strategy.apply_chunk(state, chunk.stats, plan.chunk_limit, plan.chunk_tail)
            for vnode in report.vnodes:
                state.advance_version(vnode, plan.v_new)
            if not keyed:
                report.forwarded_rows = forward.count() if forward is not None else 0
            chunk.record(self.report, (keyed or changes is None) and not fresh)
            forward = forward if report.forwarded_rows else None
            if chunk.written is not None and forward is not None:
                # a commit that deletes needs change files for all its rows: the forwarded
                # changes commit first (a valid state: old positions at v_new), the chunk's
                # files then commit alone, with no copy of its rows as change rows
                if before is None:
                    raise AssertionError("a chunk was written by a step that reads no snapshot")
                self._commit_mv(forward, None, intent=before)
                forward = None
            self._commit_mv(forward, chunk.rows,
                            clustered=chunk.clustered or chunk.scanned is not None,
                            written=chunk.written)
            committed = True
        finally:
            for df in (None if keyed else forward, chunk.rows):
                if df is not None:
                    df.unpersist()
            if chunk.written is not None and not committed:
                chunk.written.discard()  # never named by a commit
            if self.ctx.first_written is not None:  # a copy's chunk no read took
                self.ctx.first_written[1].discard()
        return self._finish()

    def _read_chunk(self, source: SnapshotSource, fresh: list[int]) -> Chunk:
        """The step's snapshot rows. A bulk step whose vnodes all start now (nothing to
        forward, not a re-snapshot) may write them into the MV in Arrow right away: the first
        phase of its commit (`step.chunk.arrow_chunk`)."""
        d, plan, state = self.req.definition, self.plan, self.state
        mv = self._mv_version()
        if not self.strategy.bulk:
            return snapshot_chunk(self.ctx, source, state, plan, d,
                                  None if self.req.reset else mv)
        alone = not self.req.reset and set(fresh) == set(self.report.vnodes)
        mv = mv if alone else None
        return bulk_chunk(self.ctx, source, state, plan, d, mv)

    def _mv_version(self) -> storage.TableVersion:
        return storage.TableVersion(self.req.tables.mv, self.req.tables.storage_options, self.mv)

    def _check_inserted(self, changes: DataFrame | pa.Table | None, started: list[int]) -> None:
        """Keys the change rows insert into started vnodes: not held twice by the upstream
        (key_checks). On the driver the check reads only key columns, and is skipped for an
        upstream whose every row came from the platform's pk-enforcing writer."""
        ctx = self.ctx
        if isinstance(changes, pa.Table):
            rows = netting.newer_than(changes, {v: -1 for v in started})
            check_inserted_keys_local(rows, ctx.tables, ctx.key_names, ctx.vnode_count,
                                      self.plan.v_new)
        elif changes is not None:
            check_inserted_keys(changes, upstream_at(ctx), started, ctx.key_names,
                                ctx.tables.upstream, self.plan.v_new)

    def _finish(self) -> StepReport:
        """After the MV commit: the progress commit, compaction, the report."""
        d, plan, state, report = self.req.definition, self.plan, self.state, self.report
        self.hook("after_mv_commit")
        self.hook("before_progress_commit")
        write_progress(self.progress_table, state, state.key_order, d.name, report.vnodes,
                       plan.v_new, force=bool(report.recovered),
                       storage_options=self.req.tables.storage_options,
                       rows=self.carried_rows)
        self.hook("after_progress_commit")
        compacted = _compact(self.ctx, report.vnodes, self.committed)
        if self.mv_version is not None and not compacted:
            remember_step(self.progress_table, self.mv, self.mv_version, d.name,
                          state.key_order, report.vnodes)
        report.progress = {v: state.current(v) for v in report.vnodes}
        report.versions = {v: plan.v_new for v in report.vnodes}
        report.seconds = time.monotonic() - self.started
        return report

    def _mv_intent(self, final: bool = True) -> storage.Intent:
        """What an MV commit of this step carries: its app transactions and the progress it
        makes (so a crash before the progress commit loses nothing), from the state as it
        is now (``final``: the state the progress commit then writes: its rows are kept)."""
        key_order, vnodes, v_new = self.state.key_order, self.report.vnodes, self.plan.v_new
        rows = progress_rows(self.state, vnodes, v_new, key_order)
        if final:
            self.carried_rows = rows
        metadata = {STEP_METADATA_KEY: step_json(self.state, vnodes, v_new, key_order, rows)}
        return owned_tables.intent(self.req.definition.name, "mv", vnodes, v_new, metadata)

    def _commit_mv(self, forward: DataFrame | storage.KeyedRows | None,
                   chunk: DataFrame | None, clustered: bool = False,
                   written: storage.BulkWritten | None = None,
                   intent: storage.Intent | None = None) -> None:
        """One atomic MV commit: forwarded changes (a Spark frame, or keyed rows found by key
        lookups on the driver) + snapshot chunk + the progress they make (``clustered``: the
        chunk's rows already come in the writer's layout, see storage/chunks/chunk_scan.py, so no
        shuffle re-lays them out). ``written``: the chunk's files, already written by the
        bulk tasks (the step's only rows), committed with the progress they make."""
        if forward is None and chunk is None and written is None and not self.req.reset:
            return
        key_order, intent = self.state.key_order, intent or self._mv_intent()
        snap = storage.TableVersion(self.req.tables.mv, self.req.tables.storage_options, self.mv) \
            if self.mv_version is None else storage.TableVersion.load(
                self.req.tables.mv, self.mv_version, self.req.tables.storage_options)

        def hook(point: str) -> None:
            self.hook(f"mv_{point}")

        if written is not None:
            self.committed = (snap, storage.commit_written(snap, intent, written, hook=hook))
            return
        rows = (chunk.where(F.col(KEEP)).drop(KEEP, ROW_NUMBER, BAD_KEY) if chunk is not None
                else None)
        keyed = forward if isinstance(forward, storage.KeyedRows) else None
        changes = None if keyed is not None else forward
        if self.req.reset:  # a re-snapshot reads only reset vnodes: their old rows go
            changes, rows = replacing(self.ctx.spark, snap, rows, self.req.reset,
                                      key_order.names), None
        # files sized by the upstream's rows, for what Spark writes (reading the upstream's log
        # for that costs a log read: a small barrier's keyed rows make one file anyway)
        spark_writes = changes is not None or rows is not None
        file_rows = mv_file_rows(self.ctx) if spark_writes else None
        clustered = clustered and rows is not None
        if keyed is not None:
            applied = storage.apply_keyed(
                snap, key_order.names, intent, keyed, inserts=rows,
                rows_hint=self.report.snapshot_rows, file_rows=file_rows,
                clustered_inserts=clustered, hook=hook)
        else:
            applied = storage.apply_changes(
                self.ctx.spark, snap, key_order.names, intent, changes, inserts=rows,
                rows_hint=self.report.snapshot_rows, file_rows=file_rows,
                clustered_inserts=clustered, hook=hook)
        self.mv_version = applied.version
        self.committed = (snap, applied)


def _compact(ctx: SourceContext, vnodes: Sequence[int],
             committed: tuple[storage.TableVersion, storage.Applied] | None) -> bool:
    """Compaction inside the barrier, after its commits, when the MV's files in this run's
    vnode span passed a threshold (storage.maintain.files_to_compact); whether it ran. After
    an MV commit the step judges that from the version it committed on and what it committed
    (`storage.compaction_due`); only when compaction is due, or the step committed nothing,
    is the latest version loaded. The replica is never rewritten by a barrier: its changes
    are appended (storage/rows/replica.py). A loaded version, not the process's latest table
    brought forward (`owned_tables.open_table`): another run in this process may hold that object
    as the snapshot its step planned on."""
    if committed is not None and not storage.compaction_due(*committed, vnodes):
        return False
    snap = storage.TableVersion.load(ctx.tables.mv, None, ctx.tables.storage_options)
    return storage.compact(ctx.spark, snap, ctx.key_names, vnodes).compacted_files > 0
