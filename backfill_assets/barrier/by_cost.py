"""A barrier over finished vnodes chooses by cost (core/cost_choice.py): apply its change set as
usual, or re-snapshot the vnodes at the barrier's version when re-reading them costs less.

The inputs are estimates that cost no data read: the change rows of each vnode's range
(v_k, v] from the upstream's log (`storage.estimate_change_rows`: commit metrics shared
among change files), the vnodes' rows from the upstream's file statistics (snapshot mode's
`estimate_rows`; listed only when the change set is large enough for the answer to depend on
them), and the unit costs this MV's earlier barriers measured (mv/unit_costs.py). Every
barrier that chose records its cost there, so the figures follow the MV's data and machine.

A re-snapshot is resnapshot.py's steps at the barrier's version (`resnapshot_steps`): each
slice one atomic MV commit replacing its vnodes' rows and carrying their progress, so a crash
recovers as any step does, and the MV lands exactly where applying the changes would have.
The choice is made only when every vnode of the barrier is finished (a backfill in progress
keeps its path), the barrier is not throttled or paused (a re-snapshot reads snapshot rows),
and the change range is readable (otherwise the mode's own path says or does what it does:
snapshot mode re-reads the vnodes whose feed is gone, the others refuse by name).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.barrier.resnapshot import resnapshot_steps
from backfill_assets.core.cost_choice import (
    APPLY,
    AUTO,
    RESNAPSHOT,
    Decision,
    UnitCosts,
    choose,
    vnode_rows_needed,
)
from backfill_assets.core.errors import ChangeFeedDisabled, HistoryUnavailable
from backfill_assets.mv.unit_costs import read_unit_costs, record_cost
from backfill_assets.step.modes import run_mode_barrier
from backfill_assets.step.modes.snapshot import estimate_rows, recovered_progress
from backfill_assets.step.request import Hook, StepReport, StepRequest, merged


@dataclass(frozen=True)
class _Sized:
    """A barrier over finished vnodes, sized: its version and each path's rows."""

    version: int
    behind: tuple[int, ...]  # the vnodes not at the version yet: what the choice is for
    change_rows: int
    vnode_rows: dict[int, int] | None  # per vnode behind; None: not needed for the choice
    costs: UnitCosts


def by_cost(spark: SparkSession, req: StepRequest, hook: Hook,
            control: str | None) -> StepReport:
    """The barrier of the request's mode, or, when its vnodes are all finished and re-reading them
    costs less (or `control` forces it), their re-snapshot at the barrier's version; the
    choice, its reason and both estimates go in the report's `extra`."""
    control = control or AUTO
    if req.rate_limit is not None:  # throttled or paused: snapshot rows are limited
        return run_mode_barrier(spark, req, hook)
    sized = _sized(req, control)
    if sized is None:
        return run_mode_barrier(spark, req, hook)
    total = None if sized.vnode_rows is None else sum(sized.vnode_rows.values())
    decision = choose(sized.change_rows, total, sized.behind, sized.version, sized.costs,
                      control)
    started = time.monotonic()
    if decision.resnapshot:
        report = _resnapshot(spark, replace(req, v_new=sized.version), hook, sized)
    else:
        report = run_mode_barrier(spark, req, hook)
    seconds = time.monotonic() - started
    _record(req, decision, report, seconds)
    return report


def _resnapshot(spark: SparkSession, req: StepRequest, hook: Hook, sized: _Sized
                ) -> StepReport:
    """Re-read the vnodes behind at the barrier's version. Vnodes already there (a rerun after
    a crash in the middle of a re-snapshot: its committed slices) run the barrier's own path,
    which has nothing to read and only completes a progress commit the crash left undone."""
    there = tuple(v for v in sorted(req.vnodes) if v not in sized.behind)
    reports = [run_mode_barrier(spark, replace(req, vnodes=there), hook)] if there else []
    reports.append(resnapshot_steps(spark, replace(req, vnodes=sized.behind), hook,
                                    sized.vnode_rows))
    return merged(reports)


def _sized(req: StepRequest, control: str) -> _Sized | None:
    """The barrier's sizes; None when the choice is not for it: a vnode not finished, nothing
    to apply (every vnode already at the version), or a change range that is not readable."""
    so = req.tables.storage_options
    version = req.v_new if req.v_new is not None else \
        storage.latest_version(req.tables.upstream, so)
    progress = recovered_progress(req, version)
    if not progress or any(not p.finished or at is None for p, at in progress.values()):
        return None
    behind = {v: at for v, (_, at) in sorted(progress.items()) if at < version}
    if not behind or any(at > version for _, at in progress.values()):
        return None  # idle, or another run got further (the step refuses it by name)
    try:
        by_vnode = storage.estimate_change_rows(req.tables.upstream, min(behind.values()),
                                                version, so)
    except (HistoryUnavailable, ChangeFeedDisabled):
        return None
    if set(by_vnode) <= {-1}:  # not partitioned by vnode: spread evenly, as the hash is
        change_rows = round(by_vnode.get(-1, 0) * len(behind) / req.definition.vnode_count)
    else:
        change_rows = sum(by_vnode.get(v, 0) for v in behind)
    costs = read_unit_costs(req.tables)
    vnode_rows = None
    if vnode_rows_needed(change_rows, costs, control):
        vnode_rows = estimate_rows(req, version, tuple(behind))
    return _Sized(version, tuple(behind), change_rows, vnode_rows, costs)


def _record(req: StepRequest, decision: Decision, report: StepReport, seconds: float) -> None:
    """The choice in the barrier's metadata, and its cost in the MV's unit costs: only for a
    barrier that did what was estimated (ended at the estimated version, recovered nothing a
    crashed run left)."""
    report.extra.update(decision.metadata())
    report.extra["barrier_choice_seconds"] = round(seconds, 3)
    if report.v_new != decision.version or report.recovered:
        return
    if decision.resnapshot:
        record_cost(req.tables, RESNAPSHOT, decision.vnode_rows or 0, seconds)
    else:
        record_cost(req.tables, APPLY, decision.change_rows, seconds)
