"""The barrier sensor: keeps the MV current, by per-barrier runs or by followers.

Per-barrier mode (default): each upstream version the MV has not reached becomes one
`backfill_job` run per configured vnode range (an MV already at the latest version, e.g. the
demo's when `make ui` starts, gets none). While some vnode is unfinished it keeps asking for
barriers even when the upstream is idle (a backfill must progress without writes), unless the
snapshot side is paused, keyed by the progress table's version and the controls in force, so
the same state never yields two runs and a resume yields one at once.

Continuous mode (BACKFILL_CONTINUOUS=1): it makes sure one `follower_job` run per vnode range is
alive, and restarts one whose run ended (a SIGKILLed follower is marked FAILURE by run
monitoring), unless the followers were stopped on request.

A join MV is due on a commit to its fact or to any dimension (`join.barrier_due`): at the
fact's head a dimension commit is a barrier for every vnode.

In both modes a range is skipped while any backfill or follower run over overlapping vnodes is
in flight (by run status), or a Dagster backfill launched from the asset pages still has
overlapping vnodes to do (its runs come later: racing them would cost a red run), and every
skipped tick says why. A run that will never run (left NOT_STARTED by a failed launch) holds
nothing: each tick marks such runs failed and logs it (`liveness.pass_over_dead`). Evaluating
it never starts a JVM: it reads Delta versions (a few ms each) and run records.
"""


from __future__ import annotations

import json
from dataclasses import dataclass

import dagster as dg

from backfill_assets import join
from backfill_assets.barrier.follower import stop_request
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import controls_changed_at, read_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.wiring.keys import MVAssets, single
from backfill_assets.wiring.liveness import (
    FOLLOWER_JOB,
    MV_TAG,
    NEVER_STARTED_AFTER,
    backfills_over,
    follower_restart,
    pass_over_dead,
    vnodes_tag,
    writers_over,
)
from backfill_assets.wiring.partitions import range_tags, split, vnode_ranges
from resources.mv import mv_tables
from resources.settings import Settings


def build_barrier_sensor(d: MVDefinition, settings: Settings, job_name: str, ranges: int,
                         never_started_after: float = NEVER_STARTED_AFTER
                         ) -> dg.SensorDefinition:
    """The sensor; `never_started_after`: seconds after which a NOT_STARTED run is known dead
    (see liveness.py)."""
    target = FOLLOWER_JOB if settings.continuous else job_name

    @dg.sensor(name="upstream_barrier_sensor", job_name=target, minimum_interval_seconds=5,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Turns each new upstream Delta version into backfill runs, or keeps "
                           "the followers alive (BACKFILL_CONTINUOUS=1).")
    def upstream_barrier_sensor(context: dg.SensorEvaluationContext):
        tables = mv_tables(d, settings)
        upstream = owned_tables.open_if_exists(tables.upstream, tables.storage_options)
        if upstream is None:
            return dg.SkipReason(f"upstream {tables.upstream} does not exist yet")
        for said in pass_over_dead(context.instance, never_started_after):
            context.log.warning(said)
        if settings.continuous:
            return keep_followers(context.instance, d, tables, ranges)
        return barrier_runs(context, d, tables, upstream.version(), ranges)

    return upstream_barrier_sensor


def barrier_runs(context: dg.SensorEvaluationContext, d: MVDefinition, tables: MVTables,
                 version: int, ranges: int, k: MVAssets | None = None,
                 p: Where | None = None):
    """The barrier runs one MV needs at upstream `version`, or why none. `k`: a folder's MV
    (its runs name it by tag, its liveness is its own; no sensor cursor: the sensor is
    shared); `p`: where it stands, when the caller has read it already."""
    k = k or single(d)
    p = p or where(d, tables, version)
    progress, unfinished, paused = p.progress, p.unfinished, p.paused
    if p.idle:
        # nothing to do at the upstream's version: on a start-up after `make demo` too, so
        # serving a finished MV never re-runs its last barrier (its verification stays shown)
        if not k.prefix:
            context.update_cursor(json.dumps({"version": version}))
        return dg.SkipReason(f"MV is at the upstream's latest version v{version} and "
                             + ("paused (resume with set_controls_job)" if unfinished
                                else "finished"))
    state = progress.version() if progress is not None else -1
    # the controls' last change is part of the key: a resume (or a new rate) at the same
    # upstream and progress versions is a new barrier, not the one before the pause again
    knobs = f"c{int((controls_changed_at(tables) or 0) * 1000)}"
    requests, waiting = [], []
    # a dimension commit is a new barrier at the same fact version, for every vnode
    current = set() if p.dimension_moved else _current_vnodes(progress, version, paused)
    for first, last in vnode_ranges(d.vnode_count, ranges):
        if all(v in current for v in range(first, last + 1)):
            continue  # this range already took this version: no second run for it
        busy = vnodes_busy(context.instance, first, last, d.vnode_count, k)
        if busy:
            waiting.append(busy)
            continue
        requests.append(dg.RunRequest(
            run_key=f"{d.name}:v{version}:p{state}:{knobs}:{first}-{last}",
            run_config={"ops": {"vnode_backfill": {"config": {"barrier_version": version}}}},
            tags={MV_TAG: d.name, **vnodes_tag(first, last)} if k.prefix
            else range_tags(first, last, d.vnode_count)))
    if not waiting and not k.prefix:  # a busy range still needs this version: again next tick
        context.update_cursor(json.dumps({"version": version, "progress": state}))
    if not requests:
        return dg.SkipReason(f"upstream at v{version}; waiting: " + "; ".join(waiting))
    return requests


def keep_followers(instance: dg.DagsterInstance, d: MVDefinition, tables: MVTables,
                   ranges: int, k: MVAssets | None = None):
    """The follower runs one MV needs (one per vnode range), or why none."""
    k = k or single(d)
    stop = stop_request(tables)
    if stop is not None:
        return dg.SkipReason(f"followers of MV {d.name!r} stopped on request ({stop['reason']}); "
                             "run start_follower_job to start them again")
    requests, reasons = [], []
    for first, last in vnode_ranges(d.vnode_count, ranges):
        busy = vnodes_busy(instance, first, last, d.vnode_count, k)
        if busy:
            reasons.append(busy)
            continue
        decision = follower_restart(instance, first, last, k.tag_filter)
        if not decision.start:
            reasons.append(f"vnodes {first}..{last}: {decision.reason}")
            continue
        requests.append(dg.RunRequest(
            run_key=f"{d.name}:follower:{first}-{last}:after:{decision.after_run_id or 'none'}",
            tags={**vnodes_tag(first, last), MV_TAG: d.name}))
    return requests or dg.SkipReason("; ".join(reasons))


def vnodes_busy(instance: dg.DagsterInstance, first: int, last: int, vnode_count: int,
          k: MVAssets) -> str:
    """Why vnodes first..last of the MV must wait ("" when no run or Dagster backfill of
    it writes them)."""
    runs = writers_over(instance, range(first, last + 1), vnode_count, mv=k.tag_filter)
    if runs:
        run = runs[0]
        return (f"vnodes {first}..{last}: {run.job_name} run {run.run_id[:8]} is "
                f"{run.status.value}")
    held = backfills_over(instance, range(first, last + 1), vnode_count, k.owned)
    if held:
        backfill_id, vnodes = held[0]
        return (f"vnodes {first}..{last}: Dagster backfill {backfill_id} has vnodes "
                f"{split(vnodes)} to do")
    return ""


def _current_vnodes(progress, version: int, paused: bool) -> set[int]:
    """The vnodes with nothing to do at ``version``: at it (or past it) and finished, or
    paused. Why: the progress table's version is part of the run key, so once one range's
    run commits, a range that already took this version would otherwise get a second run."""
    if progress is None:
        return set()
    rows = owned_tables.read_rows(progress, None, ["vnode", "backfill_finished", "version"])
    return {r["vnode"] for r in rows.to_pylist()
            if r["version"] is not None and r["version"] >= version
            and (r["backfill_finished"] or paused)}


@dataclass(frozen=True)
class Where:
    """Where one MV stands against its upstream's head: what a tick decides on."""

    progress: object  # the progress table (None: no barrier ran yet)
    at: int | None  # the version every vnode reached (None: some vnode has no row)
    unfinished: bool
    paused: bool
    version: int  # the upstream's head
    # a join MV at the fact's head whose dimension moved since its last barrier
    dimension_moved: bool = False

    @property
    def idle(self) -> bool:
        """Nothing to do at the head: every vnode at it, and finished or paused, and no
        dimension of a join MV moved."""
        return self.at is not None and self.at >= self.version and \
            (not self.unfinished or self.paused) and not self.dimension_moved


def where(d: MVDefinition, tables: MVTables, version: int) -> Where:
    """Where ``d`` stands at upstream ``version``. A join MV is due on a commit to either
    side (docs/JOINS.md): at the fact's head, it asks whether a dimension moved past the
    version pair its progress records."""
    progress = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    at, unfinished = _where(progress, d.vnode_count)
    paused = read_controls(tables).rate_limit == 0
    moved = bool(getattr(d, "joins", ())) and not paused and at is not None \
        and at >= version and join.barrier_due(d, tables)
    return Where(progress, at, unfinished, paused, version, moved)


def _where(progress, vnode_count: int) -> tuple[int | None, bool]:
    """The version every vnode has reached (None: some vnode has no progress row yet) and
    whether any vnode is unfinished."""
    if progress is None:
        return None, True
    rows = owned_tables.read_rows(progress, None, ["backfill_finished", "version"])
    versions = [v for v in rows["version"].to_pylist() if v is not None]
    at = min(versions) if rows.num_rows == vnode_count and versions else None
    return at, rows.num_rows < vnode_count or not all(rows["backfill_finished"].to_pylist())
