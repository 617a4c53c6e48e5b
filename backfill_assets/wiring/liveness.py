"""Which runs hold which vnodes, from Dagster's run records: the sensor's and the follower's view.

Why run status: with run monitoring on (the project's `deploy/dagster.yaml`, see
`run_launcher.py`) a run whose process died is marked FAILURE, so an in-flight status means a
live writer. One exception, which run monitoring never looks at and which would otherwise hold
its vnodes for ever (`pass_over_dead`): a run left NOT_STARTED. A launch moves its run on
within milliseconds (to QUEUED, or STARTING), so one still NOT_STARTED after
`NEVER_STARTED_AFTER` was created by a launch that failed (a `dagster job execute` with
partition keys that do not exist) and will never run. It is marked FAILURE with the reason
(run tag `ABANDONED_TAG`, the run's failure event) and passed over. Per-barrier runs carry
Dagster's partition range tags; follower runs carry `VNODES_TAG` ("first-last"). A run without
either covers every vnode. In-flight Dagster backfills hold the vnodes they have still to do
(`backfills_over`), and overlapping runs take turns, oldest first (`wait_turn`).

In a folder catalog each MV's vnodes are its own: every check takes `mv` and considers only the
runs of that MV (its tag `MV_TAG`, or for an asset-page run the MV its asset keys are prefixed
with), so two MVs' barriers never wait for each other except through lineage (the sensor's
order). `mv=None` (a catalog of one) considers every run.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill

from backfill_assets.wiring.partitions import RANGE_END, RANGE_START
from backfill_assets.wiring.run_launcher import process_alive, worker_pid

BACKFILL_JOB = "backfill_job"
FOLLOWER_JOB = "follower_job"
RESNAPSHOT_JOB = "resnapshot_job"
VNODES_TAG = "backfill/vnodes"
MV_TAG = "backfill/mv"  # deploy/dagster.postgres.yaml limits concurrent runs per value
# a pool follower's MVs ("a,b,c"): the MVs it still follows (one leaving it is taken off)
FOLLOWS_TAG = "backfill/follows"
FAILED_TAG = "backfill/failed"  # a pool follower's MVs that left it with an error ("a,b")
IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
             dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
             dg.DagsterRunStatus.CANCELING]
FREE_RESTARTS = 3  # consecutive failures restarted at once (kills, lost races) ...
RESTART_BACKOFF = datetime.timedelta(seconds=10)  # ... then this, doubled per failure ...
MAX_BACKOFF = datetime.timedelta(minutes=5)  # ... up to this
NEVER_STARTED_AFTER = 60.0  # s NOT_STARTED after which a run's launch is known to have failed
ABANDONED_TAG = "backfill/abandoned"  # why the sensor marked a run failed


def vnodes_tag(first: int, last: int) -> dict[str, str]:
    return {VNODES_TAG: f"{first}-{last}"}


def run_vnodes(run: dg.DagsterRun, vnode_count: int) -> range:
    """The vnodes a run writes (all of them when it names none)."""
    tags = run.tags
    if VNODES_TAG in tags:
        first, _, last = tags[VNODES_TAG].partition("-")
        return range(int(first), int(last) + 1)
    start = tags.get(RANGE_START, tags.get("dagster/partition"))
    end = tags.get(RANGE_END, start)
    if start is None:
        return range(vnode_count)
    if not (start.isdigit() and end.isdigit()):
        return range(vnode_count)  # keys no run can have: it holds nothing, but say it all
    return range(int(start), int(end) + 1)


def run_mv(run: dg.DagsterRun) -> str | None:
    """The MV a run writes: its `MV_TAG`, else the prefix of the assets it was launched for
    (an asset-page run of a folder's MV); None when neither says (it may write any MV)."""
    if MV_TAG in run.tags:
        return run.tags[MV_TAG]
    prefixes = {k.path[0] for k in run.asset_selection or () if len(k.path) > 1}
    return prefixes.pop() if len(prefixes) == 1 else None


def run_follows(run: dg.DagsterRun) -> tuple[str, ...] | None:
    """The MVs a pool follower still follows (None: not a pool run)."""
    if FOLLOWS_TAG not in run.tags:
        return None
    return tuple(n for n in run.tags[FOLLOWS_TAG].split(",") if n)


def _of_mv(run: dg.DagsterRun, mv: str | None) -> bool:
    if mv is None:
        return True
    follows = run_follows(run)
    if follows is not None:
        return mv in follows
    owner = run_mv(run)
    return owner is None or owner == mv


def writers_over(instance: dg.DagsterInstance, vnodes: Sequence[int], vnode_count: int,
                 exclude_run_id: str | None = None,
                 never_started_after: float = NEVER_STARTED_AFTER,
                 mv: str | None = None) -> list[dg.DagsterRun]:
    """In-flight backfill or follower runs that write any of `vnodes` (a dead one excepted:
    see the module docstring)."""
    wanted = set(vnodes)
    now = time.time()
    return [r.dagster_run for r in _in_flight(instance, mv)
            if r.dagster_run.run_id != exclude_run_id
            and _dead_reason(r, now, never_started_after) is None
            and wanted.intersection(run_vnodes(r.dagster_run, vnode_count))]


def pass_over_dead(instance: dg.DagsterInstance,
                   never_started_after: float = NEVER_STARTED_AFTER) -> list[str]:
    """Mark every in-flight writer that will never run FAILURE, with the reason as a run tag
    and in its failure event; what was done, one line per run (the sensor logs them)."""
    said, now = [], time.time()
    for record in _in_flight(instance):
        reason = _dead_reason(record, now, never_started_after)
        if reason is None:
            continue
        run = record.dagster_run
        instance.add_run_tags(run.run_id, {ABANDONED_TAG: reason})
        instance.report_run_failed(run, message=f"marked failed by the barrier sensor: {reason}")
        said.append(f"{run.job_name} run {run.run_id[:8]} {reason}: marked FAILURE and passed "
                    "over")
    return said


def _in_flight(instance: dg.DagsterInstance, mv: str | None = None) -> list:
    records = instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT), limit=200)
    return [r for r in records if _writes_vnodes(r.dagster_run.job_name)
            and _of_mv(r.dagster_run, mv)]


def mvs_in_flight(instance: dg.DagsterInstance) -> set[str | None]:
    """The MVs with a writer run in flight (None: a run that names no MV)."""
    out: set[str | None] = set()
    for r in _in_flight(instance):
        follows = run_follows(r.dagster_run)
        out.update(follows if follows is not None else (run_mv(r.dagster_run),))
    return out


def _dead_reason(record, now: float, never_started_after: float) -> str | None:
    """Why an in-flight run will never write (None: it may)."""
    run = record.dagster_run
    if run.status == dg.DagsterRunStatus.NOT_STARTED:
        age = now - record.create_timestamp.timestamp()
        if age > never_started_after:
            return (f"never started ({age:.0f} s NOT_STARTED: its launch failed, e.g. a "
                    "partition key that does not exist)")
        return None
    return None  # a STARTED run whose worker died: run monitoring marks it (run_launcher.py)


def _writes_vnodes(job_name: str) -> bool:
    """Barrier runs, followers, re-snapshots and asset-page materializations (Dagster's
    implicit job)."""
    return job_name in (BACKFILL_JOB, FOLLOWER_JOB, RESNAPSHOT_JOB) or \
        job_name.startswith("__ASSET_JOB")


@dataclass(frozen=True)
class Restart:
    """What the sensor should do about the follower of one vnode range."""

    start: bool
    reason: str
    after_run_id: str | None = None  # the dead run a restart replaces (makes the run key)


def follower_restart(instance: dg.DagsterInstance, first: int, last: int,
                     mv: str | None = None) -> Restart:
    """Start when none ever ran or the last one ended; back off after consecutive failures
    (a follower that fails at once must not relaunch in a tight loop)."""
    tags = {**vnodes_tag(first, last), **({MV_TAG: mv} if mv is not None else {})}
    records = instance.get_run_records(dg.RunsFilter(job_name=FOLLOWER_JOB, tags=tags), limit=8)
    return _restart([(r, r.dagster_run.status == dg.DagsterRunStatus.FAILURE) for r in records])


def pool_tag(names: Sequence[str]) -> str:
    """A pool run's `MV_TAG` ("a,b"): never one MV's own value, so the run queue's
    one-run-per-MV limit does not hold a pool and a one-MV run of its MVs apart."""
    return ",".join(sorted(names))


def pool_restart(records: Sequence, mv: str) -> Restart:
    """`follower_restart` for an MV the sensor serves in pools, from the latest follower runs
    (`records`, newest first): its runs are its one-MV followers and every pool run started
    for it (`MV_TAG` lists it). Its part of a pool run failed when it left the run with an
    error (`FAILED_TAG`) or the run failed while still following it (the process died);
    leaving by a stop request, or a run that ended well, is no failure."""
    mine = [r for r in records if mv in _started_for(r.dagster_run)][:8]
    return _restart([(r, _failed_in(r.dagster_run, mv)) for r in mine])


def _started_for(run: dg.DagsterRun) -> set[str]:
    owner = run.tags.get(MV_TAG, "")
    return set(owner.split(",")) if FOLLOWS_TAG in run.tags else {owner}


def _failed_in(run: dg.DagsterRun, mv: str) -> bool:
    if FOLLOWS_TAG not in run.tags:
        return run.status == dg.DagsterRunStatus.FAILURE
    if mv in run.tags.get(FAILED_TAG, "").split(","):
        return True
    return run.status == dg.DagsterRunStatus.FAILURE and mv in (run_follows(run) or ())


def _restart(outcomes: Sequence[tuple]) -> Restart:
    """The decision from (run record, whether the MV's follower failed in it), newest first."""
    if not outcomes:
        return Restart(True, "no follower ran for this range yet")
    last_run = outcomes[0][0]
    run = last_run.dagster_run
    failures = 0
    for _, failed in outcomes:
        if not failed:
            break
        failures += 1
    if failures == 0:
        ended = "left it" if run.status in IN_FLIGHT else f"ended ({run.status.value})"
        return Restart(True, f"follower {run.run_id[:8]} {ended}", run.run_id)
    extra = failures - FREE_RESTARTS
    wait = min(MAX_BACKOFF, RESTART_BACKOFF * (2 ** (extra - 1))) if extra > 0 else None
    # a pool run it left is still in flight: it left at the run's last tag update
    ended = last_run.end_time or last_run.update_timestamp.timestamp()
    if wait is not None and ended is not None:
        remaining = ended + wait.total_seconds() - time.time()
        if remaining > 0:
            return Restart(False, f"follower failed {failures} times in a row; restarting in "
                                  f"{remaining:.0f} s (see run {run.run_id[:8]})")
    return Restart(True, f"follower {run.run_id[:8]} died (FAILURE); restarting", run.run_id)


# a Dagster backfill (the asset pages' "Materialize…" of several vnodes, `launchPartition-
# Backfill`) owns its vnodes from its request on: its runs are created by the daemon later
BACKFILL_ACTIVE = [BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING]
VNODE_ASSETS = ("downstream_mv", "backfill_progress", "replicated_state")


def backfills_over(instance: dg.DagsterInstance, vnodes: Sequence[int], vnode_count: int,
                   assets: Sequence[str] = VNODE_ASSETS) -> list[tuple[str, list[int]]]:
    """(backfill id, the vnodes of `vnodes` it still has to do) of every in-flight Dagster
    backfill of this platform's assets that targets any of them; `assets`: the MV's
    vnode-partitioned assets (a folder's MV has its own, `MVAssets.owned`)."""
    wanted, held = set(vnodes), []
    for backfill in instance.get_backfills(BulkActionsFilter(statuses=BACKFILL_ACTIVE)):
        overlap = sorted(wanted.intersection(_backfill_vnodes(backfill, vnode_count, assets)))
        if overlap:
            held.append((backfill.backfill_id, overlap))
    return held


def _backfill_vnodes(backfill: PartitionBackfill, vnode_count: int,
                     assets: Sequence[str] = VNODE_ASSETS) -> set[int]:
    """The vnodes a backfill has still to do (every vnode when that cannot be read: a backfill
    stored in an older format is never raced)."""
    data = backfill.asset_backfill_data
    if data is None:
        if backfill.partition_names is not None and backfill.job_name == BACKFILL_JOB:
            return {int(k) for k in backfill.partition_names if k.isdigit()}
        return set(range(vnode_count)) if backfill.is_asset_backfill else set()
    todo = data.target_subset - (data.materialized_subset | data.failed_and_downstream_subset)
    keys: set[str] = set()
    for asset, subset in todo.partitions_subsets_by_asset_key.items():
        if asset.to_user_string() in assets:
            keys.update(subset.get_partition_keys())
    return {int(k) for k in keys if k.isdigit()}


TURN_POLL_SECONDS = 5.0  # how often a run waiting for its turn looks again


def _worker_gone(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """A STARTED run whose recorded worker process no longer exists on this host: a
    SIGKILLed `dagster job execute` stays STARTED where no daemon monitors runs, and waiting
    for it would wait for ever (a worker on another host counts as gone: fencing decides)."""
    if run.status != dg.DagsterRunStatus.STARTED:
        return False
    recorded = worker_pid(instance, run.run_id)
    return recorded is not None and not process_alive(*recorded)


def wait_turn(instance: dg.DagsterInstance, run_id: str, vnodes: Sequence[int],
              vnode_count: int, say: Callable[[str], None], mv: str | None = None) -> None:
    """Wait while a run over any of `vnodes` that was created before run `run_id` is in
    flight (followers excepted: they never end, and fencing decides a race with one).

    Why: the sensor skips vnodes that a run or a Dagster backfill holds, but a backfill
    launched from the UI within a tick of the sensor's run would otherwise race it and one of
    the two fail with ConcurrentBackfillRun. Oldest first is one queue: of two overlapping
    runs exactly one waits, so they never deadlock."""
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        return
    mine = (record.create_timestamp.timestamp(), run_id)
    said = None
    while True:
        ahead = [r for r in _in_flight(instance, mv)
                 if r.dagster_run.job_name != FOLLOWER_JOB
                 and (r.create_timestamp.timestamp(), r.dagster_run.run_id) < mine
                 and _dead_reason(r, time.time(), NEVER_STARTED_AFTER) is None
                 and set(vnodes).intersection(run_vnodes(r.dagster_run, vnode_count))
                 and not _worker_gone(instance, r.dagster_run)]
        if not ahead:
            return
        run = ahead[0].dagster_run
        if run.run_id != said:
            said = run.run_id
            say(f"waiting for {run.job_name} run {run.run_id[:8]} ({run.status.value}), "
                "launched earlier over some of the same vnodes; this run starts when it ends")
        time.sleep(TURN_POLL_SECONDS)
