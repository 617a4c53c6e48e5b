"""Snapshot mode (the default for a new MV): one bulk read at a pinned version, committed in
vnode-range slices, then catch-up from the change feed.

A barrier in snapshot mode is a short sequence of ordinary steps (`step.loop.run_step`, the one step
loop) at ONE upstream version v (the barrier's, pinned for all of them):
1. the vnodes already Completed forward the change feed (v_k, v] (a first catch-up coalesces
   every version since the snapshot), in steps over vnode ranges of at most
   `catch_up_rows` estimated change rows each (default 16,384; an upstream arranged by the MV's
   vnodes; each step reads only its vnodes' files), so the driver holds a bounded part of
   the writer's volume at a time;
2. the others are read in bulk (`core.snapshot.BulkPositions`, `step.bulk_read`) one slice at a
   time: a slice is a contiguous vnode range of about `slice_rows` rows (estimated from the
   upstream's Delta file statistics) and one step, so each slice commit carries its progress
   (app transactions per vnode + the step metadata) and recovery works as for every mode; a
   crash loses at most the slice in flight, and its vnodes are Completed at v once committed;
3. without a pinned version, catch-up rounds follow at the latest version while the MV is more
   than one version behind and closing in (`core.snapshot.more_catch_up`; each round coalesces
   all versions available).
Before slices start, the expected duration is compared with the upstream's log and file
retention (`core.snapshot.history_safety`, recorded in the run's metadata). If the change feed
a step needs is gone (HistoryUnavailable: vacuumed, log cleaned up), the vnodes of that step are
re-snapshotted at v (their MV rows replaced in one commit) and the run's metadata says so;
no change is dropped silently. A rate limit or a pause selects the chunked path (arrangement's
steps) instead, which the metadata records too.

Its snapshot source (`BulkSource`) is a time-travel read of the upstream version, read whole per
vnode (partition-pruned when the upstream is arranged by the same vnodes, else the vnode is
computed from the key); no replica, and the bulk read checks its own keys (step/bulk_read.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from backfill_assets import storage
from backfill_assets.arrow.expressions import NotExact
from backfill_assets.core.errors import HistoryUnavailable
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import VNODE
from backfill_assets.core.progress import NotStarted
from backfill_assets.core.snapshot import (
    BULK_LIMIT,
    BulkPositions,
    catch_up_lag,
    catch_up_slices,
    history_safety,
    more_catch_up,
    plan_slices,
    slice_summary,
)
from backfill_assets.engine.projection import exact_projection
from backfill_assets.mv import owned_tables
from backfill_assets.mv.recovery import recover_state
from backfill_assets.step.loop import run_step
from backfill_assets.step.modes.arrangement import ARRANGEMENT
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.step.request import Hook, Mode, StepReport, StepRequest
from backfill_assets.step.seek_chunk import replica_schema
from backfill_assets.step.source_context import SourceContext
from backfill_assets.upstream import same_vnodes

MAX_CATCH_UP_ROUNDS = 8
CHUNKED_PATH = ARRANGEMENT  # a rate limit or a pause: arrangement's steps


def run_snapshot_barrier(spark: SparkSession, req: StepRequest, hook: Hook) -> StepReport:
    """One barrier of a snapshot-mode MV (see the module docstring)."""
    if req.rate_limit is not None:
        report = run_step(spark, replace(req, mode=CHUNKED_PATH), hook)
        why = "paused" if req.rate_limit == 0 else f"rate limit {req.rate_limit} rows/s"
        report.extra["snapshot_path"] = f"chunked ({CHUNKED_PATH.name} steps): {why}"
        return report
    so = req.tables.storage_options
    version = req.v_new if req.v_new is not None else \
        storage.latest_version(req.tables.upstream, so)
    run = _Run(spark, req, hook)
    run.barrier(version)
    if req.v_new is None:  # catch up until within one barrier of the upstream
        for _ in range(MAX_CATCH_UP_ROUNDS):
            latest = storage.latest_version(req.tables.upstream, so)
            lag = catch_up_lag(latest, run.version)
            if not more_catch_up(lag, run.covered):
                break
            run.catch_up_rounds += 1
            run.barrier(latest)
    run.lag = catch_up_lag(storage.latest_version(req.tables.upstream, so), run.version)
    return run.report()


@dataclass
class _Run:
    """The steps of one snapshot-mode barrier and what they did."""

    spark: SparkSession
    req: StepRequest
    hook: Hook
    version: int = -1
    reports: list[StepReport] = field(default_factory=list)
    slices: list[tuple[int, ...]] = field(default_factory=list)
    slices_done: dict[int, int] = field(default_factory=dict)
    estimates: dict[int, int] = field(default_factory=dict)
    history: str | None = None
    history_safe: bool | None = None
    resnapshots: list[dict] = field(default_factory=list)
    catch_up_rounds: int = 0
    catch_up_steps: int = 0
    covered: int | None = None  # versions the last round closed (None: it read in bulk)
    lag: int = 0
    started: float = field(default_factory=time.monotonic)

    def barrier(self, version: int) -> None:
        """Forward the finished vnodes, then read the others slice by slice, all at `version`."""
        self.version = version
        progress = recovered_progress(self.req, version)
        finished = tuple(v for v, (p, _) in sorted(progress.items()) if p.finished)
        pending = tuple(v for v, (p, _) in sorted(progress.items()) if not p.finished)
        since = [at for _, at in progress.values() if at is not None]
        self.covered = version - min(since) if since and not pending else None
        for s in self._catch_up({v: progress[v][1] for v in finished}):
            self._step(s)
        if not pending:
            return
        self.estimates.update(estimate_rows(self.req, version, pending))
        slices = plan_slices({v: self.estimates[v] for v in pending},
                             self.req.definition.slice_rows)
        config = storage.table_configuration(self.req.tables.upstream, version,
                                                 self.req.tables.storage_options)
        safety = history_safety(sum(self.estimates[v] for v in pending), config)
        self.history, self.history_safe = safety.message(), safety.safe
        for s in slices:
            self.slices.append(s)
            report = self._step(s)
            if report is not None:
                self.slices_done[len(self.slices) - 1] = report.snapshot_rows

    def _catch_up(self, at: dict[int, int | None]) -> list[tuple[int, ...]]:
        """The finished vnodes' catch-up steps (`core.snapshot.catch_up_slices`), sized by the
        change files of (oldest version, barrier's version] per vnode (a vnode already at the
        barrier's version counts none: a rerun after a kill between steps redoes no work);
        one step when the upstream is not arranged by the MV's vnodes or its log no longer
        holds the range (that step then re-snapshots them, see `_step`)."""
        finished = tuple(sorted(at))
        since = [v for v in at.values() if v is not None]
        if not finished or not since or min(since) >= self.version:
            return [finished] if finished else []
        d, tables = self.req.definition, self.req.tables
        key_names = [c.name for c in d.primary_key]
        sizes = None
        if same_vnodes(tables.upstream, self.version, key_names, d.vnode_count,
                       tables.storage_options):
            try:
                sizes = storage.change_rows_by_vnode(tables.upstream, min(since), self.version,
                                             tables.storage_options)
            except HistoryUnavailable:
                sizes = None
        if sizes is not None:
            sizes = {v: 0 if at[v] is not None and at[v] >= self.version else sizes.get(v, 0)
                     for v in finished}
        steps = catch_up_slices(finished, sizes, d.catch_up_rows)
        self.catch_up_steps += len(steps)
        return steps

    def _step(self, vnodes: tuple[int, ...], reset: bool = False) -> StepReport | None:
        """One step over `vnodes`; when its change feed is gone, re-snapshot them instead."""
        req = replace(self.req, v_new=self.version, vnodes=vnodes,
                      reset=vnodes if reset else ())
        try:
            report = run_step(self.spark, req, self.hook)
        except HistoryUnavailable as exc:
            if reset:
                raise  # a re-snapshot reads no change feed: the version itself is gone
            self.resnapshots.append({"vnodes": vnodes, "version": self.version,
                                     "reason": str(exc).splitlines()[0]})
            self.estimates.update(estimate_rows(self.req, self.version, vnodes))
            done = [self._step(s, reset=True)
                    for s in plan_slices({v: self.estimates[v] for v in vnodes},
                                         self.req.definition.slice_rows)]
            return _merged(done, self.version, vnodes) if done else None
        self.reports.append(report)
        return report

    def report(self) -> StepReport:
        """All the barrier's steps as one report, with snapshot mode's figures in `extra`."""
        out = _merged(self.reports, self.version, tuple(sorted(self.req.vnodes)))
        out.seconds = time.monotonic() - self.started
        out.extra.update({"snapshot_path": "bulk", "catch_up_rounds": self.catch_up_rounds,
                          "catch_up_steps": self.catch_up_steps, "lag_versions": self.lag})
        if self.slices:
            out.extra.update({
                "slices_planned": len(self.slices), "slices_done": len(self.slices_done),
                "slices": _slice_table(slice_summary(self.slices, self.estimates,
                                                     self.slices_done))})
        if self.history is not None:
            out.extra.update({"history_check": self.history,
                              "history_safe": bool(self.history_safe)})
        if self.resnapshots:
            out.extra["resnapshot_vnodes"] = sum(len(r["vnodes"]) for r in self.resnapshots)
            out.extra["resnapshots"] = "; ".join(
                f"vnodes {r['vnodes'][0]}..{r['vnodes'][-1]} re-read at v{r['version']} "
                f"({r['reason']})" for r in self.resnapshots)
        return out


def _merged(reports: list[StepReport | None], version: int, vnodes: tuple[int, ...]
            ) -> StepReport:
    out = StepReport(version, vnodes, BULK_LIMIT)
    for r in reports:
        if r is None:
            continue
        out.snapshot_rows += r.snapshot_rows
        out.forwarded_rows += r.forwarded_rows
        out.replicated_rows += r.replicated_rows
        out.seconds += r.seconds
        out.recovered += [v for v in r.recovered if v not in out.recovered]
        out.progress.update(r.progress)
        out.versions.update(r.versions)
    bulk = sorted({r.extra["bulk_engine"] for r in reports
                   if r is not None and "bulk_engine" in r.extra})
    if bulk:  # how the slices' rows were projected: arrow, or spark and why
        out.extra["bulk_engine"] = "; ".join(bulk)
    engines = {r.engine for r in reports if r is not None}
    out.engine = engines.pop() if len(engines) == 1 else ("mixed" if engines else out.engine)
    return out


def recovered_progress(req: StepRequest, version: int) -> dict:
    """Each vnode's (progress, version) as a step would recover it (read only; NotStarted when
    the MV's tables do not exist yet)."""
    key_order = checked_upstream(req.tables, req.definition, version).key_order
    so = req.tables.storage_options
    progress_table = owned_tables.open_if_exists(req.tables.progress, so)
    mv = owned_tables.open_if_exists(req.tables.mv, so)
    if progress_table is None or mv is None:
        return {v: (NotStarted(), None) for v in req.vnodes}
    state, _ = recover_state(req.definition.name, key_order, sorted(req.vnodes),
                             progress_table, mv)
    return {v: (state.current(v), state.version(v)) for v in req.vnodes}


def estimate_rows(req: StepRequest, version: int, vnodes: tuple[int, ...]) -> dict[int, int]:
    """Rows per vnode from the upstream's Delta file statistics: exact per vnode when the
    upstream is arranged by the same vnodes, else its total spread evenly (the hash is)."""
    d, so = req.definition, req.tables.storage_options
    table = owned_tables.open_if_exists(req.tables.upstream, so, version)
    files = pa.table(table.get_add_actions(flatten=True))
    counts = [n or 0 for n in files.column("num_records").to_pylist()]
    key_names = [c.name for c in d.primary_key]
    if same_vnodes(req.tables.upstream, version, key_names, d.vnode_count, so):
        per_vnode: dict[int, int] = defaultdict(int)
        for vnode, n in zip(files.column("partition.vnode").to_pylist(), counts, strict=True):
            per_vnode[int(vnode)] += n
        return {v: per_vnode.get(v, 0) for v in vnodes}
    even = -(-sum(counts) // d.vnode_count)
    return {v: even for v in vnodes}


def _slice_table(rows: list[dict]) -> str:
    lines = ["| slice | vnodes | estimated rows | rows read | done |", "|---|---|---|---|---|"]
    lines += [f"| {r['slice']} | {r['vnodes']} | {r['estimated_rows']} | {r['rows_read']} | "
              f"{'yes' if r['done'] else 'no'} |" for r in rows]
    return "\n".join(lines)


class BulkSource:
    """Snapshot mode: every remaining row of a vnode, straight from the upstream version."""

    checks_keys = True  # step/bulk_read.read_remainder checks null / duplicate pks itself
    writes_chunks = False  # reads vnodes whole

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | pa.Table | None, hook: Hook) -> int:
        hook("after_replica_commit")
        return 0

    def read(self, ctx: SourceContext, vnodes: Sequence[int], *, key_only: bool = False
             ) -> tuple[DataFrame, bool]:
        """The vnodes' rows (``key_only``: their pk and vnode columns only, what the bulk
        read's stats and key checks need) and whether each Spark partition holds one
        contiguous vnode range: true for a platform upstream partitioned by the MV's vnodes,
        whose files are then read in vnode-range tasks and sorted by (vnode, key) in them, so
        the MV write needs neither a shuffle nor a Spark sort."""
        so = ctx.tables.storage_options
        schema = replica_schema(ctx.upstream_schema)
        if key_only:
            schema = pa.schema([schema.field(c) for c in (*ctx.key_names, VNODE)])
        if same_vnodes(ctx.tables.upstream, ctx.v_new, ctx.key_names, ctx.vnode_count, so):
            return storage.read_version(ctx.spark, ctx.tables.upstream, ctx.v_new, schema,
                                          vnodes=vnodes, storage_options=so,
                                          cluster_keys=ctx.key_names), True
        up = storage.read_version(ctx.spark, ctx.tables.upstream, ctx.v_new,
                                    pa.schema([f for f in schema if f.name != VNODE]),
                                    storage_options=so)
        return ctx.with_vnode(up).where(owned_tables.vnode_in(vnodes)), False

    def arrow_rows(self, ctx: SourceContext, vnodes: Sequence[int], d: MVDefinition,
                   key_order: KeyOrder) -> storage.BulkRows | None:
        """The vnodes' whole rows projected by Python tasks alone (no row through the JVM),
        when the definition compiles to Arrow with Spark's meaning (`engine.projection.
        exact_projection`) and the upstream is arranged by the MV's vnodes (each task then
        reads one vnode range); None otherwise (the Spark path)."""
        so = ctx.tables.storage_options
        if not same_vnodes(ctx.tables.upstream, ctx.v_new, ctx.key_names, ctx.vnode_count, so):
            return None
        projection = exact_projection(ctx.spark, d, ctx.upstream_schema)
        if projection is None:
            return None
        snap = storage.TableVersion.load(ctx.tables.upstream, ctx.v_new, so)
        return storage.BulkRows(snap, tuple(vnodes), tuple(snap.arrow_schema.names),
                                projection, key_order, NotExact)

    def key_stats(self, ctx: SourceContext, positions: Mapping[int, Key | None],
                  key_order: KeyOrder, unique_keys: bool
                  ) -> dict[int, tuple[int, Key, bool]] | None:
        """Per vnode (rows after its position, last key, pk null or repeated) of a
        vnode-partitioned platform upstream: from its log alone when that is exact (keys the
        platform writer kept unique, vnodes read from their start, a single integer pk,
        files without DVs: `storage.vnode_stats_from_log`), else computed in the read tasks
        from the key columns. None for any other upstream (its vnodes are computed in Spark:
        `read_remainder` aggregates)."""
        so = ctx.tables.storage_options
        if not same_vnodes(ctx.tables.upstream, ctx.v_new, ctx.key_names, ctx.vnode_count, so):
            return None
        snap = storage.TableVersion.load(ctx.tables.upstream, ctx.v_new, so)
        single = key_order.columns[0]
        if unique_keys and len(key_order.columns) == 1 and not single.descending \
                and single.type in ("int", "bigint") \
                and all(p is None for p in positions.values()):
            stats = storage.vnode_stats_from_log(snap.files, single.name, positions)
            if stats is not None:
                return stats
        return storage.vnode_key_stats(ctx.spark, snap, key_order, positions)


SNAPSHOT = Mode("snapshot", BulkPositions, BulkSource(), barrier_steps=run_snapshot_barrier,
                throttled_path=CHUNKED_PATH)
