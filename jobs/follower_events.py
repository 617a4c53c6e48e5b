"""What a follower tells Dagster per barrier, for a one-MV follower and a pool alike."""

import dagster as dg

from backfill_assets.barrier.follower import BarrierRecord
from backfill_assets.barrier.runner import controls_in_force
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.step.modes import mode_named
from backfill_assets.wiring.checks import progress_result
from backfill_assets.wiring.events import record_barrier, summary_metadata
from backfill_assets.wiring.keys import MVAssets


class BarrierEmitter:
    """Per barrier: a log line, the events of the vnodes whose progress moved and the
    barrier's summary event (wiring/events.py) with the follower's lag, the
    `backfill_finished` check result (so the check speaks of the follower's latest barrier),
    and run tags (the run page's
    header) with barriers done, lag and rows/s. Unchanged vnodes emit nothing: a follower at
    256 vnodes must not spend seconds per barrier on events. In a pool (`run_tags` off) the
    run serves many MVs: its log lines name the MV, and the run tags are the pool's
    (`follower_pool.py`), not one MV's."""

    def __init__(self, context: dg.OpExecutionContext, d: MVDefinition, tables,
                 k: MVAssets, run_tags: bool = True) -> None:
        self.context, self.d, self.tables, self.k = context, d, tables, k
        self.run_tags = run_tags
        self.seen: dict = {}

    def __call__(self, rec: BarrierRecord) -> None:
        ctx, report, figs = self.context, rec.report, rec.figures
        moved = [v for v in report.vnodes if self.seen.get(v) != report.progress[v]]
        self.seen.update(report.progress)
        lag = {"lag_versions": rec.lag_versions, "lag_seconds": round(rec.lag_seconds, 2)}
        who = "" if self.run_tags else f"MV {self.d.name}: "
        ctx.log.info(
            f"{who}barrier {rec.number} @v{report.v_new}: {report.snapshot_rows} snapshot rows, "
            f"{report.forwarded_rows} forwarded, {report.seconds:.2f} s, lag "
            f"{rec.lag_versions} versions / {rec.lag_seconds:.1f} s, "
            f"{figs.vnodes_finished}/{self.d.vnode_count} finished")
        to_mv = rec.commit_to_mv_seconds
        controls, states = controls_in_force(self.d, self.tables), vnode_states(self.tables)
        summary = {**summary_metadata(self.d, self.tables, report, figs, controls, states),
                   **lag, "follower_barrier": rec.number,
                   "commit_to_mv_seconds": round(to_mv, 2) if to_mv is not None else -1.0}
        record_barrier(ctx.log_event, self.d, report, summary, rec.upstream_version,
                       mode_named(self.d.mode).owns_replica, changed=moved, keys=self.k)
        ctx.log_event(progress_result(ctx.instance, figs, controls, states, report.v_new,
                                      key=self.k.mv))
        if not self.run_tags:
            return
        ctx.instance.add_run_tags(ctx.run_id, {
            "follower/barriers": str(rec.number), "follower/version": str(report.v_new),
            "follower/lag_versions": str(rec.lag_versions),
            "follower/lag_seconds": f"{rec.lag_seconds:.1f}",
            "follower/rows_per_second": f"{figs.rows_per_second:.0f}"})


