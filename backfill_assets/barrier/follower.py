"""Continuous mode: one long-running loop per MV (or vnode range) on a warm Spark session.

Why: a run per barrier pays a Dagster launch and a JVM start before any work, so an upstream
commit reaches the MV only after both. The follower stays inside one run and loops: wait for
the upstream's next log entry (a cheap stat of the next commit file, storage/delta/log_wait.py),
run the barrier (`runner.run_barrier`, the very path `backfill_job` runs) over every version
that arrived since (coalesced), record it, repeat. Exactly once, recovery and fencing are the
step's: a follower killed anywhere is repaired by the next barrier of the next follower.

Stopping: a stop request (`request_stop`, written by `stop_follower_job`) or an interrupt (Dagster
run termination, Ctrl-C) ends the loop after the barrier in flight has committed; a second
interrupt abandons it at once (its commits are atomic and recoverable, nothing is
half-visible). A stop request stays in force until `clear_stop` (`start_follower_job`), so the
barrier sensor does not restart a follower someone stopped. It is a small document beside the
MV's tables (`storage.store.documents`), so it works the same on a local folder and an object store.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import SparkSession

from backfill_assets.barrier.runner import controls_in_force, figures, run_barrier, watched_uris
from backfill_assets.core.errors import ConcurrentBackfillRun
from backfill_assets.core.figures import MVFigures
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import read_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook, StepReport, no_hook
from backfill_assets.storage import objects, read_json, wait_for_any_commit, write_json

DEFAULT_POLL_SECONDS = 1.0
MAX_CONFLICTS = 3  # consecutive ConcurrentBackfillRun before the follower gives the vnodes up


@dataclass(frozen=True)
class BarrierRecord:
    """One barrier of a follower, as the UI shows it."""

    number: int  # barriers this follower ran so far (1-based)
    report: StepReport
    figures: MVFigures
    upstream_version: int  # the upstream's latest version right after the barrier committed
    lag_seconds: float  # age of the oldest upstream commit the MV does not have yet (0: none)
    commit_to_mv_seconds: float | None  # oldest commit this barrier brought in -> its MV commit

    @property
    def lag_versions(self) -> int:
        return max(0, self.upstream_version - self.report.v_new)


@dataclass
class FollowerSummary:
    barriers: int = 0
    conflicts: int = 0
    stopped_by: str = ""  # "stop request", "interrupt", "max barriers"


def stop_uri(tables: MVTables) -> str:
    """Where a stop request lives: beside the MV's tables (local folder or object store), so
    the follower, the stop/start jobs and the barrier sensor all see it wherever they run."""
    return objects.join(tables.root, "follower_stop.json")


def request_stop(tables: MVTables, reason: str) -> None:
    """Ask every follower of the MV to stop after its barrier in flight (atomic write)."""
    write_json(stop_uri(tables), {"requested_at": time.time(), "reason": reason},
               tables.storage_options)


def clear_stop(tables: MVTables) -> bool:
    """Withdraw a stop request; True if there was one."""
    return objects.delete(stop_uri(tables), tables.storage_options)


def stop_request(tables: MVTables) -> dict | None:
    """The stop request in force ({"requested_at", "reason"}), or None."""
    try:
        return read_json(stop_uri(tables), tables.storage_options)
    except json.JSONDecodeError:
        return None


def upstream_version(tables: MVTables) -> int | None:
    """The upstream's latest version (a log read, milliseconds), None before it exists."""
    table = owned_tables.open_if_exists(tables.upstream, tables.storage_options)
    return None if table is None else table.version()


def follow(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int], *,
           on_barrier: Callable[[BarrierRecord], None], stop: threading.Event,
           poll_seconds: float = DEFAULT_POLL_SECONDS, max_barriers: int | None = None,
           log: Callable[[str], None] = print, hook: Hook = no_hook) -> FollowerSummary:
    """Run barriers for `vnodes` whenever there is work, until `stop` is set or a stop request
    is found. Work: a new upstream version, or unfinished vnodes while not paused (a backfill
    must progress on an idle upstream). Controls are re-read before every barrier."""
    summary, done_version, unfinished, conflicts = FollowerSummary(), None, True, 0
    watched, done = watched_uris(d, tables), None  # done: the watched versions the MV holds
    while True:
        if stop.is_set() or stop_request(tables) is not None:
            summary.stopped_by = "interrupt" if stop.is_set() else "stop request"
            return summary
        if max_barriers is not None and summary.barriers >= max_barriers:
            summary.stopped_by = "max barriers"
            return summary
        latest = _versions(watched, tables)
        paused = read_controls(tables).rate_limit == 0
        if latest is None:
            stop.wait(poll_seconds)
            continue
        if latest == done and (not unfinished or paused):
            # idle: wait on the next log entry itself, not a poll interval (log_wait.py); the
            # stop request and the controls are looked at again every poll_seconds
            wait_for_any_commit([(u, v + 1) for u, v in zip(watched, latest, strict=True)],
                                tables.storage_options, timeout=poll_seconds, stop=stop)
            continue
        try:
            report = run_barrier(spark, d, tables, vnodes, hook=hook)
        except ConcurrentBackfillRun as exc:
            summary.conflicts += 1
            conflicts += 1
            if conflicts >= MAX_CONFLICTS:
                raise
            log(f"another run wrote vnodes of this follower ({exc}); retrying at the next "
                f"barrier ({conflicts}/{MAX_CONFLICTS})")
            stop.wait(poll_seconds)
            continue
        conflicts = 0
        summary.barriers += 1
        first_new = None if done_version is None else done_version + 1
        done_version, unfinished = report.v_new, not report.finished
        done = (report.v_new, *report.extra.get("dimension_versions", ()))
        on_barrier(_record(d, tables, summary.barriers, report, first_new))


def _versions(uris: Sequence[str], tables: MVTables) -> tuple[int, ...] | None:
    """The latest version of each watched table (log reads), None while one is missing."""
    found = [owned_tables.open_if_exists(u, tables.storage_options) for u in uris]
    return None if any(t is None for t in found) else tuple(t.version() for t in found)


def _record(d: MVDefinition, tables: MVTables, number: int, report: StepReport,
            first_new: int | None) -> BarrierRecord:
    """Figures, lag and commit-to-MV time of a barrier (a few log reads)."""
    upstream = owned_tables.open_if_exists(tables.upstream, tables.storage_options)
    latest = upstream.version()
    wanted = [v for v in (first_new, report.v_new + 1) if v is not None and v <= latest]
    times = _commit_times(upstream, min(wanted)) if wanted else {}
    now = time.time()
    lag = now - times[report.v_new + 1] if report.v_new + 1 in times else 0.0
    brought = first_new if first_new is not None and first_new <= report.v_new else None
    to_mv = now - times[brought] if brought in times else None
    figs = figures(d, tables, controls_in_force(d, tables), report.v_new)
    return BarrierRecord(number, report, figs, latest, lag, to_mv)


def _commit_times(upstream, since: int) -> dict[int, float]:
    """Commit time (s) of every upstream version >= `since` (newest first in the log)."""
    limit = upstream.version() - since + 1
    return {int(h["version"]): h["timestamp"] / 1000.0
            for h in upstream.history(limit=max(1, limit))}


@contextmanager
def stop_on_interrupt(stop: threading.Event, on_first: Callable[[], None]) -> Iterator[None]:
    """SIGINT/SIGTERM (Dagster run termination, Ctrl-C) sets `stop`: the barrier in flight
    finishes first. A second interrupt raises KeyboardInterrupt at once (abandon it). Only the
    main thread can own signals; elsewhere the caller's `stop` event is the only way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signo, _frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt("second interrupt: abandoning the barrier in flight")
        stop.set()
        on_first()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
