"""Aggregate MVs (`group_by` + `aggregates`): an MV kind of its own beside the row MV's step
loop, reached from `barrier.runner.run_barrier` through `run_barrier` here
(docs/AGGREGATES.md). barrier.py runs one barrier; projection.py turns upstream rows into
signed input rows; store.py holds the three tables; cost.py chooses apply or recompute."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession

from backfill_assets.aggregate import arrangement, barrier
from backfill_assets.core.errors import AggregateModeUnsupported
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.modes import mode_named
from backfill_assets.step.request import Hook, StepReport, no_hook

__all__ = ["run_barrier"]

MODES = ("snapshot", *arrangement.MODES)


def run_barrier(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
                *, version: int | None = None, controls: Controls, hook: Hook = no_hook,
                recompute: bool = False) -> StepReport:
    """One barrier of the aggregate MV ``d`` at ``version`` (latest when None). It covers
    every upstream vnode whatever ``vnodes`` a run names: the groups are keyed by the group
    key, so any upstream row may move any group, and one barrier brings the whole MV to one
    version (a second run of the same barrier finds it done). Paused (rate limit 0): nothing
    runs. Arrangement and no_shuffle: one step of per-vnode positions (aggregate/arrangement.py).
    ``recompute``: every table recomputed at the version even when the MV is there already
    (an aggregate MV's re-snapshot: resnapshot_job)."""
    bulk = mode_named(d.mode).bulk  # snapshot mode: one bulk aggregation, then the change feed
    if recompute and not bulk:
        raise AggregateModeUnsupported(
            f"MV {d.name!r} is an aggregate MV in mode {d.mode!r}: aggregate MVs are built in "
            f"modes {', '.join(MODES)}, and re-snapshotted in snapshot mode only (an "
            "arrangement backfill restarts by reset); set a supported mode in the definition "
            "or reset the MV")
    if controls.rate_limit == 0:
        return StepReport(version if version is not None else -1, tuple(vnodes), 0)
    if not bulk:  # positions per upstream vnode, or one shared (aggregate/arrangement.py)
        return arrangement.run(spark, d, tables, version, controls, hook)
    return barrier.run(spark, d, tables, version, controls, hook, recompute)
