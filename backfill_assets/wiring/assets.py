"""The four vnode-partitioned assets. Wiring only: the work is `run_barrier`.

Partition statuses say what is true of each vnode, not merely that a run touched it:
`backfill_progress` (and `replicated_state`) are materialized for every vnode a barrier
committed, `downstream_mv` only for vnodes whose backfill is finished. An unfinished vnode of
the MV gets an observation with its position instead, so the MV's Partitions tab reads
finished = materialized, in progress = missing with an observation, not started = missing
(and `backfill_progress` tells the last two apart). The outputs are skippable and never
yielded, so these runtime events are the only materializations. `upstream_table` gets no
events: once it has any, Dagster fetches its data versions at step start, which fails in a run
without a partition range (`backfill_job` without range tags).
"""

import time
from collections.abc import Callable, Sequence

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.progress import Completed
from backfill_assets.mv.controls import Controls
from backfill_assets.step.barrier import controls_in_force, figures, run_barrier, vnode_states
from backfill_assets.step.loop import Hook, StepReport, no_hook
from backfill_assets.wiring.checks import progress_result
from backfill_assets.wiring.metadata import barrier_metadata, read_cost, vnode_metadata
from backfill_assets.wiring.partitions import split, vnode_key, vnode_partitions, vnodes_of
from resources.mv import mv_tables
from resources.settings import Settings
from resources.spark import LazySession
from resources.warehouse import WarehouseResource

UPSTREAM = dg.AssetKey("upstream_table")
REPLICA = dg.AssetKey("replicated_state")
MV = dg.AssetKey("downstream_mv")
PROGRESS = dg.AssetKey("backfill_progress")

# what the barrier log says at each phase boundary (the step's hook points)
PHASES = {
    "before_write": "upstream checked, progress recovered, step planned",
    "after_replica_commit": "replicated_state committed (the change chunk)",
    "after_mv_commit": "downstream_mv committed (forwarded changes + snapshot chunk)",
    "after_progress_commit": "backfill_progress committed",
}
# a long barrier of several steps (snapshot mode's slices) records the check's result at its
# later progress commits at most this often, so the asset page moves while it runs; the
# barrier's end always does (a one-step barrier records only that one)
INTERIM_RESULT_SECONDS = 30.0


class BarrierConfig(dg.Config):
    """Per-run overrides; leave unset to use the controls in force (see set_controls_job)."""

    barrier_version: int | None = Field(
        default=None, description="Upstream version to step to (unset: the latest). The "
                                  "barrier sensor sets it so a barrier is idempotent.")
    chunk_size: int | None = Field(
        default=None, description="Snapshot rows per vnode for this run only (unset: the "
                                  "controls in force, else the MV definition's).")
    rate_limit: int | None = Field(
        default=None, description="Snapshot rows per second for this run only; 0 pauses the "
                                  "snapshot side (unset: the controls in force).")


def build_assets(d: MVDefinition, settings: Settings, hook: Hook | None = None) -> list:
    """`upstream_table` (written by upstream_load_job or another engine, so not materializable
    here) and the multi-asset that runs one barrier for the run's vnode range."""
    parts = vnode_partitions(d.vnode_count)
    upstream = dg.AssetSpec(
        UPSTREAM, partitions_def=parts, group_name="backfill",
        description=f"The upstream Delta table {d.upstream} (change feed on). Written by "
                    "upstream_load_job or another engine: the platform only reads it, so it "
                    "is not materialized here. The MV's lag behind it is in the barrier's "
                    "figures (downstream_mv/backfill_finished).")
    specs = [
        dg.AssetSpec(REPLICA, deps=[UPSTREAM], partitions_def=parts, group_name="backfill",
                     skippable=True,
                     description="The backfill's arrangement of the upstream, per vnode: kept "
                                 "by arrangement mode and by snapshot mode's throttled path "
                                 "(a snapshot-mode bulk read needs none, so it stays empty)."),
        dg.AssetSpec(MV, deps=[REPLICA], partitions_def=parts, group_name="backfill",
                     skippable=True,
                     description=f"MV {d.name!r}: Delta, partitioned by vnode, change feed on. "
                                 "A partition is materialized once its vnode is finished."),
        dg.AssetSpec(PROGRESS, deps=[MV], partitions_def=parts, group_name="backfill",
                     skippable=True,
                     description="Backfill state: | vnode | pk... | finished | row_count |; "
                                 "a partition is materialized once its vnode has started."),
    ]

    @dg.multi_asset(specs=specs, name="vnode_backfill", partitions_def=parts,
                    backfill_policy=dg.BackfillPolicy.single_run())
    def vnode_backfill(context: dg.AssetExecutionContext, config: BarrierConfig,
                       spark: LazyPySparkResource, warehouse: WarehouseResource):
        ranged = context.has_partition_key or context.has_partition_key_range
        vnodes = vnodes_of(context.partition_keys) if ranged else list(range(d.vnode_count))
        tables = mv_tables(d, settings, warehouse.options())
        controls = controls_in_force(d, tables, Controls(config.chunk_size,
                                                         config.rate_limit).validated())
        span = split(vnodes)
        context.log.info(f"barrier for vnodes {span} starting: {controls.describe()}")
        session = LazySession(lambda: spark.spark_session,  # a driver-only barrier: no JVM
                              spark.spark_config)
        report = run_barrier(session, d, tables, vnodes,
                             version=config.barrier_version, overrides=controls,
                             hook=_PhaseLog(context, span, d, tables, controls,
                                            hook or no_hook))
        figs = figures(d, tables, controls, report.v_new)
        cost = read_cost(report, figs, d.mode)
        if cost is not None and cost.layout_bound:  # no_shuffle over an unclustered upstream
            context.log.warning(cost.statement())
        if report.extra.get("resnapshots"):  # snapshot mode lost its change feed: say so
            context.log.warning(f"change feed gone, re-snapshot: {report.extra['resnapshots']}")
            context.log_event(dg.AssetObservation(MV, metadata={
                "resnapshots": dg.MetadataValue.text(report.extra["resnapshots"]),
                "resnapshot_vnodes": dg.MetadataValue.int(report.extra["resnapshot_vnodes"])}))
        context.log.info(
            f"barrier v{report.v_new} vnodes {span}: "
            f"{report.snapshot_rows} snapshot rows, {report.forwarded_rows} forwarded, "
            f"{figs.percent_done:.1f}% done, {figs.vnodes_finished}/{d.vnode_count} finished, "
            f"{figs.state}")
        states = vnode_states(tables)
        context.log_event(dg.AssetObservation(
            MV, metadata=barrier_metadata(report, figs, controls, states)))
        record_vnodes(context.log_event, d, report, vnodes, figs.upstream_version)
        # last: the result targets the MV's latest materialization (this barrier's, if any)
        context.log_event(progress_result(context.instance, figs, controls, states, report.v_new))
        yield from ()

    return [upstream, vnode_backfill]


def record_vnodes(log_event: Callable[[object], None], d: MVDefinition, report: StepReport,
                  vnodes: Sequence[int], upstream_version: int) -> None:
    """The per-vnode events of a barrier (also the follower's): progress (and replica) are
    materialized for every vnode committed, the MV only for finished vnodes, an unfinished
    vnode of the MV is observed with its facts instead."""
    # snapshot mode's chunked path (rate limit or pause) keeps the replica as arrangement does
    chunked = str(report.extra.get("snapshot_path", "")).startswith("chunked")
    owned = (REPLICA, PROGRESS) if d.mode == "arrangement" or chunked else (PROGRESS,)
    for vnode in vnodes:
        key = vnode_key(vnode, d.vnode_count)
        meta = vnode_metadata(report, vnode, upstream_version)
        for asset in owned:
            log_event(dg.AssetMaterialization(asset, partition=key, metadata=meta))
        done = isinstance(report.progress[vnode], Completed)
        event = dg.AssetMaterialization if done else dg.AssetObservation
        log_event(event(MV, partition=key, metadata=meta))


class _PhaseLog:
    """A step hook that logs each phase boundary, so a running barrier is not silent (with
    the MV's percent done at each progress commit: one per slice in snapshot mode), records
    the check's result at a step's progress commit after the first at most every
    INTERIM_RESULT_SECONDS, then calls `then` (the kill points of the crash tests)."""

    def __init__(self, context: dg.AssetExecutionContext, span: str, d: MVDefinition,
                 tables, controls: Controls, then: Hook) -> None:
        self.context, self.span, self.d, self.tables = context, span, d, tables
        self.controls, self.then = controls, then
        self.started = self.reported = time.monotonic()
        self.commits = 0

    def __call__(self, point: str) -> None:
        if point in PHASES:
            said = (f"barrier for vnodes {self.span}: {PHASES[point]} "
                    f"({time.monotonic() - self.started:.1f} s)")
            if point == "after_progress_commit":
                said += self._progress()
            self.context.log.info(said)
        self.then(point)

    def _progress(self) -> str:
        figs = figures(self.d, self.tables, self.controls)
        if figs is None:
            return ""
        self.commits += 1
        if self.commits > 1 and time.monotonic() - self.reported >= INTERIM_RESULT_SECONDS:
            self.reported = time.monotonic()
            self.context.log_event(progress_result(self.context.instance, figs, self.controls,
                                                   vnode_states(self.tables)))
        return (f"; MV {figs.percent_done:.1f}% done, "
                f"{figs.vnodes_finished}/{self.d.vnode_count} vnodes finished")
