"""Dagster's run queue, with every run tagged by its MV before it is queued.

Why: the queue's one-run-per-MV limit (`tag_concurrency_limits` on `backfill/mv`,
deploy/dagster.yaml) counts a run by its tags when the daemon dequeues it. The sensor tags its
runs, but a run launched from the launchpad or `dagster job launch` that names its MV in
config only (`mv: orders`) would be tagged by its op once it runs: too late, two runs of one
MV could be dequeued together. So the coordinator, which every launch goes through (the
launchpad's launchRun, `dagster job launch`, a sensor's request, a backfill's runs), adds the
tag from the run's config (`mv` of any op: one MV, `all`, or a follower's `mvs` list), else
from the MV prefix of the assets it was launched for, before the run is queued. A tag the
launch gave is kept. `dagster job execute` runs in the calling process and is not queued.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext

from backfill_assets.wiring.liveness import MV_TAG, run_mv


def config_mv(run_config: Mapping | None) -> str | None:
    """The MV a run's config names (`ops.<op>.config.mv`, or a follower's `mvs`), or None."""
    for op in ((run_config or {}).get("ops") or {}).values():
        config = (op or {}).get("config") if isinstance(op, Mapping) else None
        if not isinstance(config, Mapping):
            continue
        if config.get("mv"):
            return str(config["mv"])
        if config.get("mvs"):
            return ",".join(sorted(str(n) for n in config["mvs"]))
    return None


def mv_tag_for(run: dg.DagsterRun) -> str | None:
    """The `backfill/mv` tag a run should be queued with, or None (it has one, or names none)."""
    if MV_TAG in run.tags:
        return None
    return config_mv(run.run_config) or run_mv(run)


class MVTaggingRunCoordinator(QueuedRunCoordinator):
    """QueuedRunCoordinator that tags each run with its MV before queueing it."""

    def submit_run(self, context: SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        mv = mv_tag_for(run)
        if mv is not None:
            self._instance.add_run_tags(run.run_id, {MV_TAG: mv})
            run = self._instance.get_run_by_id(run.run_id) or run
            context = SubmitRunContext(run, workspace=context.workspace)
        return super().submit_run(context)
