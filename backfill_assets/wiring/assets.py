"""The four vnode-partitioned assets. Wiring only: the work is `run_barrier`.

Partition statuses say what is true of each vnode (wiring/events.py): `backfill_progress` is
materialized for every vnode that has started, `downstream_mv` for every vnode that is
finished, `replicated_state` for the vnodes whose replica a barrier kept. The outputs are
skippable and never yielded, so these runtime events are the only materializations. Each
barrier ends with one summary event of `downstream_mv` (the MV's figures and a per-vnode
table), which the asset's Overview shows. `upstream_table` gets no events: once it has any,
Dagster fetches its data versions at step start, which fails in a run without a partition
range (`backfill_job` without range tags).

Two kinds of run execute the barrier op: `backfill_job` (the sensor's, the demo's) runs ONE
barrier; a materialization launched from the asset pages or `dagster asset materialize` (a run
of Dagster's asset job, alone or inside a Dagster backfill) runs barriers until every vnode it
was asked for is finished, so each partition it targets ends materialized and the Dagster
backfill ends Succeeded (unless the snapshot side is paused: then it says so and stops).

`replicated_state` is part of the barrier's multi-asset only in arrangement mode, whose every
barrier keeps it; in snapshot mode only the throttled path (a rate limit or a pause) keeps it
and in no_shuffle mode nothing does, so there it is declared like the upstream (not
materializable: the launch dialog never asks for it) and the lineage says so.
"""

import time

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from backfill_assets.barrier.pacing import BARRIER_SECONDS
from backfill_assets.barrier.runner import controls_in_force, figures, run_barrier
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.step.modes import mode_named
from backfill_assets.step.request import Hook, Mode, StepReport, no_hook
from backfill_assets.wiring.checks import progress_result
from backfill_assets.wiring.events import (  # noqa: F401 (a catalog of one's keys, re-exported)
    MV,
    PROGRESS,
    REPLICA,
    UPSTREAM,
    record_barrier,
    summary_metadata,
)
from backfill_assets.wiring.keys import MV_NAME, MVAssets, single
from backfill_assets.wiring.liveness import BACKFILL_JOB, wait_turn
from backfill_assets.wiring.metadata import read_cost
from backfill_assets.wiring.named_errors import named_first
from backfill_assets.wiring.partitions import split, vnode_partitions, vnodes_of
from resources.mv import mv_tables
from resources.settings import Settings
from resources.spark import LazySession
from resources.warehouse import WarehouseResource

# what the barrier log says at each phase boundary (the step's hook points)
PHASES = {
    "before_write": "upstream checked, progress recovered, step planned",
    "after_replica_commit": "replicated_state committed (the change chunk)",  # if kept
    "after_mv_commit": "downstream_mv committed (forwarded changes + snapshot chunk)",
    "after_progress_commit": "backfill_progress committed",
}
# a long barrier of several steps (snapshot mode's slices) records the check's result at its
# later progress commits at most this often, so the asset page moves while it runs; the
# barrier's end always does (a one-step barrier records only that one)
INTERIM_RESULT_SECONDS = 30.0
BACKFILL_TAG = "dagster/backfill"  # a run launched by a Dagster backfill (the asset pages')
STOPPED_TAG = "backfill/stopped"  # why a barrier stopped its Dagster backfill


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
    barrier_choice: str | None = Field(
        default=None, description="For this run only: auto, apply or resnapshot (a barrier "
                                  "over finished vnodes applies its changes or re-reads the "
                                  "vnodes; unset: the controls in force, else auto).")


def build_assets(d: MVDefinition, settings: Settings, hook: Hook | None = None,
                 keys: MVAssets | None = None) -> list:
    """`upstream_table` (written by upstream_load_job or another engine, so not materializable
    here; in a folder catalog the shared external asset of the table, built once in
    definitions.py) and the multi-asset that runs one barrier for the run's vnode range."""
    k = keys or single(d)
    parts = vnode_partitions(d.vnode_count)
    upstream = dg.AssetSpec(
        k.upstream, partitions_def=parts, group_name=k.group,
        description=f"The upstream Delta table {d.upstream} (change feed on). Written by "
                    "upstream_load_job or another engine: the platform only reads it, so it "
                    "is not materialized here. The MV's lag behind it is in the barrier's "
                    "figures (downstream_mv/backfill_finished).")
    mode = mode_named(d.mode)
    owns_replica = mode.owns_replica
    replica = _replica_spec(d, parts, mode, k)
    # snapshot mode reads the replica on its throttled path only: no edge (an edge to an
    # asset with events has Dagster fetch its data versions, which fails in an unranged run)
    mv_inputs = [k.replica] if owns_replica else _reads(k)
    specs = [
        dg.AssetSpec(k.mv, deps=mv_inputs, partitions_def=parts, group_name=k.group,
                     skippable=True,
                     description=f"MV {d.name!r} ({d.mode} mode): Delta, partitioned by vnode, "
                                 "change feed on. A partition is materialized once its vnode is "
                                 "finished (again by every barrier that brings it up to date); "
                                 "each barrier's last event here has the MV's figures and a "
                                 "per-vnode table."),
        dg.AssetSpec(k.progress, deps=[k.mv], partitions_def=parts, group_name=k.group,
                     skippable=True,
                     description="Backfill state: | vnode | pk... | finished | row_count |; "
                                 "a partition is materialized once its vnode has started."),
    ]
    if owns_replica:
        specs.insert(0, replica)

    # can_subset: "Materialize" of downstream_mv alone (the asset page, `dagster asset
    # materialize --select downstream_mv`) runs the barrier, which records all its assets
    @dg.multi_asset(specs=specs, name=k.op("vnode_backfill"), partitions_def=parts,
                    can_subset=True,
                    backfill_policy=dg.BackfillPolicy.single_run())
    @named_first
    def vnode_backfill(context: dg.AssetExecutionContext, config: BarrierConfig,
                       spark: LazyPySparkResource, warehouse: WarehouseResource):
        ranged = context.has_partition_key or context.has_partition_key_range
        vnodes = vnodes_of(context.partition_keys) if ranged else list(range(d.vnode_count))
        run_barriers(context, d, k, settings, vnodes, config, spark, warehouse, hook or no_hook)
        yield from ()

    return ([upstream] if k.owns_upstream else []) + [vnode_backfill] + \
        ([] if owns_replica else [replica])


def _reads(k: MVAssets) -> list:
    """The MV's inputs: another MV's output is read whole by each vnode (its rows hash to any
    of this MV's vnodes), so every partition of it feeds every partition here."""
    return [dg.AssetDep(key, partition_mapping=dg.AllPartitionMapping())
            if key.path[-1] == MV_NAME and key.path[0] != "tables" else key for key in k.reads]


def run_barriers(context: dg.OpExecutionContext, d: MVDefinition, k: MVAssets,
                 settings: Settings, vnodes: list[int], config: BarrierConfig,
                 spark: LazyPySparkResource, warehouse: WarehouseResource, hook: Hook) -> None:
    """The barrier op's one code path: the multi-asset's (asset pages, `backfill_job` of a
    catalog of one) and the folder catalog's `backfill_job` (jobs/backfill.py)."""
    tables = mv_tables(d, settings, warehouse.options())
    overrides = Controls(config.chunk_size, config.rate_limit, config.barrier_choice).validated()
    session = LazySession(lambda: spark.spark_session,  # a driver-only barrier: no JVM
                          spark.spark_config)
    _barriers(context, d, k, tables, vnodes, session, config.barrier_version, overrides,
              mode_named(d.mode).owns_replica, hook)


def _barriers(context: dg.OpExecutionContext, d: MVDefinition, k: MVAssets, tables,
              vnodes: list[int], session: LazySession, version: int | None,
              overrides: Controls, owns_replica: bool, hook: Hook) -> None:
    """One barrier for `backfill_job` (the sensor's, the demo's); for the asset pages' launch
    (and `dagster asset materialize`) barriers until every partition asked for ends
    materialized, i.e. its vnode finished (or the snapshot side is paused, or nothing moves)."""
    until_finished = context.run.job_name != BACKFILL_JOB
    wait_turn(context.instance, context.run.run_id, vnodes, d.vnode_count, context.log.info,
              mv=k.tag_filter)
    barriers = 0
    while True:
        barriers += 1
        report = _barrier(context, d, k, tables, vnodes, session, version, overrides,
                          owns_replica, hook)
        if not until_finished or report.finished:
            break
        if controls_in_force(d, tables, overrides).rate_limit == 0:
            context.log.warning(
                f"the snapshot side is paused: vnodes {split(vnodes)} cannot finish, so "
                "their unfinished partitions stay unmaterialized; resume with "
                "set_controls_job (snapshot: resume) and launch again")
            _stop_dagster_backfill(context, "stopped: the MV is paused (resume with "
                                            "set_controls_job, then launch again)")
            break
        if report.snapshot_rows == 0 and not report.recovered:
            break  # nothing moved (no snapshot rows left to read): never loop idle
    if until_finished:
        context.log.info(f"{barriers} barrier{'s' * (barriers != 1)} brought vnodes "
                         f"{split(vnodes)} to "
                         f"{'finished' if report.finished else 'where they stand'}")


def _stop_dagster_backfill(context: dg.AssetExecutionContext, reason: str) -> None:
    """Mark the run's Dagster backfill Canceled, with `reason` as its tag `STOPPED_TAG`.

    Why: the backfill daemon counts a partition its runs left unmaterialized as failed, so a
    backfill stopped by a pause read a red "Failure" in Overview › Backfills beside its green
    run; nothing failed, the MV was paused. Canceled is what happened (and is final, so the
    daemon leaves it so)."""
    backfill_id = context.run.tags.get(BACKFILL_TAG)
    backfill = context.instance.get_backfill(backfill_id) if backfill_id else None
    if backfill is None or backfill.status != BulkActionStatus.REQUESTED:
        return
    stopped = backfill.with_status(BulkActionStatus.CANCELED).with_end_timestamp(time.time())
    context.instance.update_backfill(stopped._replace(tags={**backfill.tags,
                                                             STOPPED_TAG: reason}))
    context.log.warning(f"Dagster backfill {backfill_id} marked Canceled: {reason}")


def _barrier(context: dg.OpExecutionContext, d: MVDefinition, k: MVAssets, tables,
             vnodes: list[int], session: LazySession, version: int | None,
             overrides: Controls, owns_replica: bool, hook: Hook) -> StepReport:
    """One barrier with its log lines and events (wiring/events.py), then the check's result."""
    controls = controls_in_force(d, tables, overrides)
    span = split(vnodes)
    context.log.info(f"barrier for vnodes {span} starting: {controls.describe()}")
    report = run_barrier(session, d, tables, vnodes, version=version, overrides=controls,
                         hook=PhaseLog(context, span, d, tables, controls, hook),
                         pace_seconds=BARRIER_SECONDS)  # a run costs seconds: a minute's worth
    figs = figures(d, tables, controls, report.v_new)
    cost = read_cost(report, figs, mode_named(d.mode).seeks_upstream)
    if cost is not None and cost.layout_bound:  # no_shuffle over an unclustered upstream
        context.log.warning(cost.statement())
    if report.extra.get("resnapshots"):  # snapshot mode lost its change feed: say so
        context.log.warning(f"change feed gone, re-snapshot: {report.extra['resnapshots']}")
    context.log.info(
        f"barrier v{report.v_new} vnodes {span}: "
        f"{report.snapshot_rows} snapshot rows, {report.forwarded_rows} forwarded, "
        f"{figs.percent_done:.1f}% done, {figs.vnodes_finished}/{d.vnode_count} finished, "
        f"{figs.state}")
    states = vnode_states(tables)
    record_barrier(context.log_event, d, report,
                   summary_metadata(d, tables, report, figs, controls, states),
                   figs.upstream_version, owns_replica,
                   in_backfill=BACKFILL_TAG in context.run.tags, keys=k)
    # last: the result targets the MV's latest materialization (this barrier's, if any)
    context.log_event(progress_result(context.instance, figs, controls, states, report.v_new,
                                      key=k.mv))
    return report


def _replica_spec(d: MVDefinition, parts: dg.PartitionsDefinition, mode: Mode,
                  k: MVAssets) -> dg.AssetSpec:
    """`replicated_state`: produced by the barrier in arrangement mode; elsewhere declared only
    (its kind in the lineage says when it is kept)."""
    if mode.owns_replica:
        return dg.AssetSpec(k.replica, deps=_reads(k), partitions_def=parts,
                            group_name=k.group, skippable=True,
                            description="The backfill's arrangement of the upstream, per vnode "
                                        "(arrangement mode): materialized for every started "
                                        "vnode a barrier kept.")
    used = mode.keeps_replica(throttled=True)  # snapshot mode's chunked path
    return dg.AssetSpec(
        k.replica, deps=_reads(k), partitions_def=parts, group_name=k.group,
        kinds={"delta", "throttled_path_only" if used else "unused_in_no_shuffle"},
        description=(
            "The backfill's arrangement of the upstream, per vnode. Snapshot mode keeps it "
            "only on its throttled path (a rate limit or a pause: arrangement's chunked "
            "steps); its bulk read takes the upstream directly, so after an unthrottled "
            "backfill it stays empty. Not materializable here: barriers record it."
            if used else
            "Not used in no_shuffle mode (the MV reads the upstream directly); declared so "
            "the asset set is the same in every mode."))


class PhaseLog:
    """A step hook that logs each phase boundary, so a running barrier (or re-snapshot:
    `work`) is not silent (with the MV's percent done at each progress commit: one per slice
    in snapshot mode), records the check's result at a step's progress commit after the
    first at most every INTERIM_RESULT_SECONDS, then calls `then` (the crash tests' kill
    points)."""

    def __init__(self, context: dg.AssetExecutionContext, span: str, d: MVDefinition,
                 tables, controls: Controls, then: Hook, work: str = "barrier") -> None:
        self.context, self.span, self.d, self.tables = context, span, d, tables
        self.controls, self.then, self.work = controls, then, work
        self.started = self.reported = time.monotonic()
        self.commits = 0
        # arrangement keeps the replica; snapshot mode on its chunked path only (a rate limit
        # or a pause)
        self.replica = mode_named(d.mode).keeps_replica(controls.rate_limit is not None)

    def __call__(self, point: str) -> None:
        if point in PHASES and (point != "after_replica_commit" or self.replica):
            said = (f"{self.work} for vnodes {self.span}: {PHASES[point]} "
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
