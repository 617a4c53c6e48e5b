"""One barrier of an aggregate MV (docs/AGGREGATES.md, "How it runs"): the whole MV, every
upstream vnode, brought from the version its progress records to the barrier's.

1. recover: each table (group state, kept input, MV) tells by its app transaction which
   barrier it holds; a barrier some table holds but the progress does not is completed first
   (its change range is re-read; only the tables behind it are written);
2. the first barrier aggregates the upstream at its version in Spark (`BULK`); a later one
   applies the change feed, netted per key, as -1 pre-images and +1 post-images, reading only
   the touched groups' state and kept input (`APPLY`), or recomputes every table at the
   barrier's version when the cost model says that is cheaper (`RECOMPUTE`, aggregate/cost.py);
3. commits, each carrying the barrier's app transaction: state, kept input, MV (finished from
   the state and kept input of the touched groups), then progress (every upstream vnode
   Completed at the barrier's version), by a background thread once the others landed
   (mv/commit_later.py: the next open of the progress table in this process waits for it).
Every table's content is a function of the barrier's version alone, whichever path wrote it,
so a table brought forward by any path after a crash lands where the others are.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.aggregate import checkpoint, cost, held
from backfill_assets.aggregate.checkpoint import Commit
from backfill_assets.aggregate.feed import Feed
from backfill_assets.aggregate.projection import (
    Projection,
    bulk_inputs,
    bulk_partials,
    bulk_values,
    projection_of,
    recorded_schemas,
    signed_rows,
)
from backfill_assets.aggregate.store import (
    GROUP_KEY,
    INPUT,
    MV,
    STATE,
    AggregateStore,
    compact_later,
    distinct_groups,
    group_texts,
    group_vnodes,
    settle,
    with_key,
)
from backfill_assets.arrow import netting
from backfill_assets.arrow.aggregate_state import ROWS
from backfill_assets.core.cost_choice import APPLY, RESNAPSHOT
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import VNODE
from backfill_assets.core.progress import BackfillState, Completed
from backfill_assets.engine.netting import with_vnode
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


@dataclass
class _Barrier:
    """One aggregate barrier once the upstream is checked and the tables exist."""

    spark: SparkSession
    d: MVDefinition
    tables: MVTables
    upstream: CheckedUpstream
    proj: Projection
    store: AggregateStore
    progress: object  # the progress table (deltalake.DeltaTable)
    feed: Feed
    hook: Hook
    report: StepReport
    # each table's commit of the barrier: the version it planned on, what it committed
    committed: dict[str, tuple[storage.TableVersion, storage.Applied]] = field(
        default_factory=dict)

    @property
    def vnodes(self) -> tuple[int, ...]:
        return tuple(range(self.d.vnode_count))

    def progress_version(self) -> int | None:
        """The version every upstream vnode's progress is at (None: no barrier yet)."""
        rows = read_progress(self.progress, self.upstream.key_order, self.vnodes)
        versions = {v for _, v in rows.values()}
        return versions.pop() if len(rows) == len(self.vnodes) and len(versions) == 1 else None

    def txns(self) -> dict[str, int | None]:
        return {phase: self.store.txn_version(phase, self.vnodes) for phase in self.store.phases}

    def run(self, target: int, forced: str | None, again: bool = False) -> StepReport:
        """Complete a barrier a crash left behind, then bring every table to ``target``
        (``again``: recompute every table even when they are there already)."""
        at = self.progress_version()
        txns = self.txns()
        ahead = [v for v in txns.values() if v is not None and (at is None or v > at)]
        if ahead:  # a barrier committed to some tables but not to the progress
            pending = max(ahead)
            self.report.recovered = list(self.vnodes)
            self._step(at, pending, txns, None)
            at, txns = pending, {p: pending for p in self.store.phases}
        if at is not None and target < at and not ahead:
            refuse_stale(self._finished(at), self.vnodes, target, self.tables.mv)
        if at is not None and again and target == at:
            self._step(at, target, {}, forced)
        elif at is None or target > at:
            self._step(at, target, txns, forced)
            at = target
        self.report.v_new = at
        self.report.progress = {v: Completed(None, 0) for v in self.vnodes}
        self.report.versions = {v: at for v in self.vnodes}
        return self.report

    def _finished(self, version: int) -> BackfillState:
        """Every upstream vnode Completed at ``version``: an aggregate barrier reads each
        vnode whole (no position inside it; the progress rows count no rows)."""
        return BackfillState(self.upstream.key_order, self.vnodes, {
            v: (Completed(None, 0), version) for v in self.vnodes})

    def _step(self, at: int | None, to: int, txns: dict[str, int | None],
              forced: str | None) -> None:
        """Bring the tables behind ``to`` there from ``at``, then the progress."""
        behind = [p for p in self.store.phases if txns.get(p) is None or txns[p] < to]
        self.hook("before_write")
        if at is None or at == to:  # the first barrier, or a re-snapshot at the same version
            self.report.extra.update({"aggregate_path": cost.BULK if at is None
                                      else cost.RECOMPUTE})
            self._recompute(to, behind)
        else:
            choice = self._choice(at, to, forced)
            self.report.extra.update(choice.figures())
            if choice.path == APPLY:
                self._apply(at, to, behind)
            else:
                self._recompute(to, behind)
        # the progress last, in the background: every table above holds the barrier already
        # (mv/commit_later.py); the next open of the progress table waits for it
        state = self._finished(to)
        write_progress_later(self.tables.progress, self.progress, state, state.key_order,
                             self.d.name, self.vnodes, to,
                             storage_options=self.tables.storage_options, hook=self.hook)
        compacting = [p for p, c in self.committed.items()
                      if compact_later(self.store, self.spark, p, c, self.vnodes)]
        if compacting:
            self.report.extra["compacting"] = compacting  # in the background (store.py)
        self.committed.clear()

    def _choice(self, at: int, to: int, forced: str | None) -> cost.AggregateChoice:
        return cost.choose(self.feed.change_rows(at, to), lambda: self._upstream_rows(to),
                           forced)

    def _upstream_rows(self, version: int) -> int:
        """The upstream's rows at ``version``, from its log's file statistics."""
        upstream = owned_tables.open_if_exists(self.tables.upstream,
                                               self.tables.storage_options, version)
        return sum(n or 0 for n in
                   upstream.get_add_actions(flatten=True).column("num_records").to_pylist())

    def _recompute(self, to: int, behind: list[str]) -> None:
        """Every table behind ``to`` rewritten from one Spark aggregation at ``to`` (only
        the rows that differ change: the storage layer drops unchanged ones)."""
        self.report.engine = "spark"
        df = storage.read_version(self.spark, self.tables.upstream, to,
                                  pa.schema([f for f in self.upstream.schema
                                             if f.name != VNODE]),
                                  storage_options=self.tables.storage_options)
        df = with_vnode(df, list(self.upstream.key_order.names), self.upstream.key_types,
                        self.d.vnode_count)
        values = bulk_values(df, self.proj)
        if not self.proj.tables.kept:  # one aggregation, one pass: nothing to cache
            state, kept = bulk_partials(values, self.proj), None
        else:  # the kept input is a second job over the same rows
            values = values.cache()
            try:
                state = bulk_partials(values, self.proj)
                kept = bulk_inputs(values, self.proj)
            finally:
                values.unpersist()
        self.report.snapshot_rows = self._upstream_rows(to)
        self.report.extra.update(groups=state.num_rows, rows_aggregated=sum(
            state.column(ROWS).to_pylist()))
        self._write(to, behind, None, state, kept)

    def _apply(self, at: int, to: int, behind: list[str]) -> None:
        """The change range (at, to] netted per key, as signed rows into the touched groups;
        the state committed only when a checkpoint is due (aggregate/checkpoint.py)."""
        self.report.engine = "driver"
        if STATE in behind:  # the state table behind, and not held here: replayed first
            replayed = checkpoint.replay(self.store, at, self.vnodes, self._signed)
            if replayed is not None:
                self.report.extra["state_replayed"] = replayed
        netted = self.feed.netted(at, to, upstream_vnodes=self.proj.reads_vnode)
        changes = self._signed(at, to, netted)
        self.report.forwarded_rows = changes.num_rows
        self.report.extra["changed_keys"] = netted.keys
        apply_signed(self, to, behind, changes, at=at)

    def _signed(self, at: int, to: int, netted: netting.Netted | None = None) -> pa.Table:
        """The change range (at, to] as signed rows (``netted``: read already)."""
        if netted is None:
            netted = self.feed.netted(at, to, upstream_vnodes=self.proj.reads_vnode)
        return signed_rows(self.spark, self.proj, netted.before, netted.after)

    def _write(self, to: int, behind: list[str],
               changes: tuple[pa.Table, pa.Array, Sequence[int]] | None,
               state: pa.Table | None, kept: pa.Table | None, at: int | None = None) -> None:
        """The commits of the tables behind ``to``. ``changes`` (signed rows, their groups'
        keys and vnodes): each table brought forward from its touched groups' rows (``at``:
        the barrier they follow, the state committed only when a checkpoint is due; None:
        committed); otherwise ``state`` and ``kept`` are every group's, and replace each
        table whole."""
        t, store = self.proj.tables, self.store
        keys, vnodes = (changes[1], changes[2]) if changes is not None else (None, None)
        pending: list[Commit] = []
        checkpointed: Callable[[storage.Applied | None], None] = lambda _: None  # noqa: E731
        if STATE in behind and changes is not None and at is not None:
            state, job, checkpointed = checkpoint.state_step(store, at, to, keys, vnodes,
                                                             changes[0])
            pending += [job] if job is not None else []
            self.report.extra["state_checkpoint"] = job is not None
        elif STATE in behind:
            snap, old = store.read(STATE, keys, vnodes)
            if changes is not None:
                state, _ = t.state_update(old, changes[0])
            state = with_key(state, t)
            pending.append((STATE, snap, old, state))
        elif changes is not None or state is None:
            state = store.read(STATE, keys, vnodes)[1]
        if INPUT in store.phases:
            if INPUT in behind:
                snap, old = store.read(INPUT, keys, vnodes)
                if changes is not None:
                    kept = t.input_of(t.input_update(old, changes[0])[0])
                pending.append((INPUT, snap, old, with_key(kept, t)))
            elif changes is not None or kept is None:
                kept = store.read(INPUT, keys, vnodes)[1]
        if MV in behind:
            snap, old = store.read(MV, keys, vnodes)
            mv = t.mv_rows(state, kept if kept is not None else t.input_schema.empty_table())
            texts = state.column(GROUP_KEY) if GROUP_KEY in state.schema.names else None
            pending.append((MV, snap, old, with_key(mv, t, texts)))
            self.report.extra["groups_written"] = mv.num_rows
        self._commit(to, pending)
        if STATE in self.committed and changes is None:  # every group's state: a checkpoint
            checkpoint.committed_whole(store.table(STATE).uri, *self.committed[STATE], to)
        checkpointed(self.committed[STATE][1] if STATE in self.committed else None)

    def _commit(self, to: int, pending: list[Commit]) -> None:
        """The tables' commits side by side, each in a thread of its own (their writes and
        log commits wait on files, not on Python), the progress commit after all of them.
        Why any order is safe: each table holds the barrier by its own app transaction and
        is brought forward on its own by recovery (the module docstring), so whichever
        subset a crash lets land, the next barrier completes the rest."""
        def one(job: Commit) -> tuple[str, storage.TableVersion, storage.Applied]:
            phase, snap, old, new = job
            applied = self.store.write(phase, snap, old, new, to, self.vnodes, self.hook)
            self.hook(f"after_{phase}_commit")  # after_agg_state_commit, after_mv_commit, ...
            return phase, snap, applied

        if len(pending) < 2:
            done = [one(job) for job in pending]
        else:
            with ThreadPoolExecutor(len(pending), thread_name_prefix="agg-commit") as pool:
                done = list(pool.map(one, pending))
        for phase, snap, applied in done:
            self.committed[phase] = (snap, applied)
            # rewritten whole from the held rows, or given DVs (storage.apply_keyed's whole)
            self.report.extra[f"{phase}_rewritten"] = applied.rewrote


def apply_signed(b: _Barrier, txn: int, behind: list[str], changes: pa.Table,
                 at: int | None = None) -> None:
    """Signed rows into the tables ``behind``, reading and writing only their groups, each
    commit carrying ``txn`` (the barrier's version; arrangement mode's step number, whose
    state is committed at every step). ``at``: the barrier the changes follow, given only
    for the snapshot mode's change feed (a replay can read it again): the state is then
    committed only when a checkpoint is due."""
    groups = distinct_groups(changes, b.proj.tables)  # keys and vnodes per group, not per row
    keys = group_texts(groups, b.proj.tables)
    b.report.extra["touched_groups"] = len(keys)
    vnodes = held.TouchedVnodes(lambda: group_vnodes(groups, b.proj.tables))
    b._write(txn, behind, (changes, keys, vnodes), None, None, at)


def open_barrier(spark: SparkSession, d: MVDefinition, tables: MVTables, version: int | None,
                 controls: Controls, hook: Hook) -> tuple[_Barrier, int]:
    """Check the upstream and the definition (Spark's analysis of its expressions), then
    create the missing tables: nothing is written before every check passed."""
    upstream = checked_upstream(tables, d, version)
    changes = Feed(tables, upstream, d.vnode_count)
    so = tables.storage_options
    key = {"fingerprint": d.fingerprint, "upstream": base64.b64encode(
        upstream.schema.serialize().to_pybytes()).decode("ascii")}
    doc = storage.read_json(_plan_uri(tables), so)
    recorded = doc["schemas"] if doc and doc.get("key") == key else None
    proj = projection_of(spark, d, upstream.schema, upstream.key_order, recorded)
    store = AggregateStore(d.name, tables, proj.tables, d.vnode_count)
    settle(store)  # this process's compactions of the tables, begun by the last barrier
    progress = owned_tables.ensure_table(
        tables.progress, progress_schema(upstream.key_order), so, cdf=False,
        description=upstream.pin(d, store.table(MV).schema))
    store.ensure()
    if recorded is None:
        storage.write_json(_plan_uri(tables), {"key": key, "schemas": recorded_schemas(proj)}, so)
    report = StepReport(upstream.version, tuple(range(d.vnode_count)), controls.chunk_size or 0,
                        engine="driver")
    return _Barrier(spark, d, tables, upstream, proj, store, progress, changes, hook, report), \
        upstream.version


def _plan_uri(tables: MVTables) -> str:
    return storage.objects.join(tables.aggregate_plan, "plan.json")


def run(spark: SparkSession, d: MVDefinition, tables: MVTables, version: int | None,
        controls: Controls, hook: Hook, recompute: bool = False) -> StepReport:
    """One aggregate barrier (see the module docstring) with the controls in force."""
    started = time.monotonic()
    forced = RESNAPSHOT if recompute else controls.barrier_choice
    barrier, target = open_barrier(spark, d, tables, version, controls, hook)
    report = barrier.run(target, forced, recompute)
    report.seconds = time.monotonic() - started
    return report
