"""Which runs hold which vnodes, from Dagster's run records: the sensor's and the follower's view.

Why run status and not age: with run monitoring on (the project's `dagster.yaml`, see
`run_launcher.py`) a run whose process died is marked FAILURE, so an in-flight status means a
live writer. Per-barrier runs carry Dagster's partition range tags; follower runs carry
`VNODES_TAG` ("first-last"). A run without either covers every vnode.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

BACKFILL_JOB = "backfill_job"
FOLLOWER_JOB = "follower_job"
RESNAPSHOT_JOB = "resnapshot_job"
VNODES_TAG = "backfill/vnodes"
MV_TAG = "backfill/mv"  # deploy/dagster.postgres.yaml limits concurrent runs per value
IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
             dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
             dg.DagsterRunStatus.CANCELING]
FREE_RESTARTS = 3  # consecutive failures restarted at once (kills, lost races) ...
RESTART_BACKOFF = datetime.timedelta(seconds=10)  # ... then this, doubled per failure ...
MAX_BACKOFF = datetime.timedelta(minutes=5)  # ... up to this


def vnodes_tag(first: int, last: int) -> dict[str, str]:
    return {VNODES_TAG: f"{first}-{last}"}


def run_vnodes(run: dg.DagsterRun, vnode_count: int) -> range:
    """The vnodes a run writes (all of them when it names none)."""
    tags = run.tags
    if VNODES_TAG in tags:
        first, _, last = tags[VNODES_TAG].partition("-")
        return range(int(first), int(last) + 1)
    start = tags.get("dagster/asset_partition_range_start", tags.get("dagster/partition"))
    end = tags.get("dagster/asset_partition_range_end", start)
    if start is None:
        return range(vnode_count)
    return range(int(start), int(end) + 1)


def writers_over(instance: dg.DagsterInstance, vnodes: Sequence[int], vnode_count: int,
                 exclude_run_id: str | None = None) -> list[dg.DagsterRun]:
    """In-flight backfill or follower runs that write any of `vnodes`."""
    wanted = set(vnodes)
    records = instance.get_run_records(
        dg.RunsFilter(job_name=None, statuses=IN_FLIGHT), limit=200)
    return [r.dagster_run for r in records
            if _writes_vnodes(r.dagster_run.job_name)
            and r.dagster_run.run_id != exclude_run_id
            and wanted.intersection(run_vnodes(r.dagster_run, vnode_count))]


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


def follower_restart(instance: dg.DagsterInstance, first: int, last: int) -> Restart:
    """Start when none ever ran or the last one ended; back off after consecutive failures
    (a follower that fails at once must not relaunch in a tight loop)."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=FOLLOWER_JOB, tags=vnodes_tag(first, last)), limit=8)
    if not records:
        return Restart(True, "no follower ran for this range yet")
    last_run = records[0]
    failures = 0
    for rec in records:
        if rec.dagster_run.status != dg.DagsterRunStatus.FAILURE:
            break
        failures += 1
    if failures == 0:
        return Restart(True, f"follower {last_run.dagster_run.run_id[:8]} ended "
                             f"({last_run.dagster_run.status.value})", last_run.dagster_run.run_id)
    extra = failures - FREE_RESTARTS
    wait = min(MAX_BACKOFF, RESTART_BACKOFF * (2 ** (extra - 1))) if extra > 0 else None
    ended = last_run.end_time
    if wait is not None and ended is not None:
        remaining = ended + wait.total_seconds() - time.time()
        if remaining > 0:
            return Restart(False, f"follower failed {failures} times in a row; restarting in "
                                  f"{remaining:.0f} s (see run {last_run.dagster_run.run_id[:8]})")
    return Restart(True, f"follower {last_run.dagster_run.run_id[:8]} died (FAILURE); restarting",
                   last_run.dagster_run.run_id)
