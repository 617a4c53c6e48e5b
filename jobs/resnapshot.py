"""resnapshot_job: re-read a vnode range of a finished MV from the upstream's latest version.

The Debezium-signal case: a suspected drift, or an upstream repaired by a writer that left no
change feed for it. The chosen vnodes' MV rows are replaced by a bulk read at the latest
version (barrier/resnapshot.py); the run records it on the asset: materializations of those
vnodes' partitions and a summary event with `resnapshot` ("vnodes a..b re-read at vN") and the
reason given, then the `backfill_finished` check; `verify_job` afterwards compares them with
the oracle as any other vnodes.

    dagster job execute -m backfill_assets.definitions -j resnapshot_job \\
        -c jobs/configs/resnapshot.yaml

From the UI: Jobs > resnapshot_job > Launchpad, with the same config (first_vnode,
last_vnode, reason; in a folder catalog `mv` too).
"""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from backfill_assets.barrier.resnapshot import resnapshot
from backfill_assets.barrier.runner import controls_in_force, figures
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.step.modes import mode_named
from backfill_assets.step.request import no_hook
from backfill_assets.wiring.assets import PhaseLog
from backfill_assets.wiring.checks import progress_result
from backfill_assets.wiring.events import record_barrier, summary_metadata
from backfill_assets.wiring.keys import MVChoice, Served, picked, served
from backfill_assets.wiring.liveness import MV_TAG, RESNAPSHOT_JOB, vnodes_tag, writers_over
from backfill_assets.wiring.named_errors import named_first
from backfill_assets.wiring.partitions import split
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


class ResnapshotConfig(MVChoice):
    """The vnode range to re-read (inclusive), and why (kept with the run's record)."""

    first_vnode: int = Field(description="First vnode to re-read.")
    last_vnode: int = Field(description="Last vnode to re-read (inclusive).")
    reason: str = Field(default="", description="Why (recorded on the asset's event).")


def build_resnapshot_job(d: MVDefinition | Served, settings: Settings) -> dg.JobDefinition:
    srv = served(d)

    @dg.op(name="resnapshot_vnodes")
    @named_first
    def resnapshot_vnodes(context: dg.OpExecutionContext, config: ResnapshotConfig,
                          spark: LazyPySparkResource,
                          warehouse: WarehouseResource) -> dg.Output:
        [(d, k)] = picked(context, srv, config.mv)
        vnodes = list(range(config.first_vnode, config.last_vnode + 1))
        tables = mv_tables(d, settings, warehouse.options())
        busy = writers_over(context.instance, vnodes, d.vnode_count, context.run_id,
                            mv=k.tag_filter)
        if busy:
            raise dg.Failure(f"{busy[0].job_name} run {busy[0].run_id} writes these vnodes: "
                             "let it end (or stop the followers) and launch again")
        if vnodes:  # the sensor and followers see this run as the vnodes' writer
            context.instance.add_run_tags(context.run_id, {
                **vnodes_tag(vnodes[0], vnodes[-1]), MV_TAG: d.name})
        context.log.info(f"re-snapshot of vnodes {split(vnodes)} starting (each atomic step "
                         f"replaces at most about {d.slice_rows:,} rows)")
        controls = controls_in_force(d, tables)
        report = resnapshot(spark.spark_session, d, tables, vnodes,
                            hook=PhaseLog(context, split(vnodes), d, tables, controls, no_hook,
                                          work="re-snapshot"))
        said = report.extra["resnapshot"] + (f" ({config.reason})" if config.reason else "")
        context.log.info(f"MV {d.name!r}: {said}: {report.snapshot_rows} rows read")
        figs = figures(d, tables, controls, report.v_new)
        states = vnode_states(tables)
        summary = {**summary_metadata(d, tables, report, figs, controls, states),
                   "resnapshot_reason": dg.MetadataValue.text(config.reason or "(none given)")}
        record_barrier(context.log_event, d, report, summary, figs.upstream_version,
                       mode_named(d.mode).owns_replica, keys=k)
        context.log_event(progress_result(context.instance, figs, controls, states,
                                          report.v_new, key=k.mv))
        return dg.Output(report.snapshot_rows, metadata={
            "resnapshot": said, "rows_read": report.snapshot_rows,
            "upstream_version": report.v_new})

    @dg.job(name=RESNAPSHOT_JOB, executor_def=dg.in_process_executor,
            description="Re-read a vnode range of a finished MV from the upstream's latest "
                        "version (its MV rows replaced), e.g. after a suspected drift or an "
                        "upstream repair. Config: first_vnode, last_vnode, reason.")
    def resnapshot_job():
        resnapshot_vnodes()

    return resnapshot_job
