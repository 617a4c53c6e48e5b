"""Continuous mode for many MVs: one follower loop serving them all on one warm Spark session.

Why: a follower per MV (a run, its Dagster context and threads, its own look at the upstream)
costs every idle MV tens of MiB and a poll of its upstream each; a platform keeps tens of MVs
over a few upstreams. The pool is one loop: each pass looks at the head of every table its
MVs read once (a stat of the next commit file, storage/delta/log_wait.py; the table is opened
only when that file exists), then runs, in lineage order, the barrier of each MV that has work
(`runner.run_barrier`, the very path `backfill_job` and the one-MV follower run), so a chain
follows an upstream commit in one pass. What is the MV's own stays the MV's: its stop request
(`follower.request_stop`), its controls (re-read before each of its barriers), its barrier
records and its conflicts. An MV whose barrier fails leaves the pool with its error (named in
its records by the caller's `on_end`); the others keep following. Shared: the session, the
loop, the heads of the tables read, the process's bounded caches (storage.LRU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from backfill_assets.barrier.follower import (
    DEFAULT_POLL_SECONDS,
    MAX_CONFLICTS,
    BarrierRecord,
    FollowerSummary,
    _record,
    stop_request,
)
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import ConcurrentBackfillRun
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import read_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook, no_hook
from backfill_assets.storage import wait_for_commit

LOCAL_TICK_SECONDS = 0.01  # idle: a stat of each table's next commit file per tick
REMOTE_TICK_SECONDS = 0.1  # ... one HEAD request each on an object store


@dataclass
class PoolMember:
    """One MV of the pool: what it follows and where it stands (its own, never shared)."""

    d: MVDefinition
    tables: MVTables
    vnodes: Sequence[int]
    on_barrier: Callable[[BarrierRecord], None]
    reads: tuple[str, ...] = ()  # tables whose commits are work too (a join's dimensions)
    summary: FollowerSummary = field(default_factory=FollowerSummary)
    done: tuple[int | None, ...] | None = None  # heads its last barrier took
    unfinished: bool = True
    conflicts: int = 0
    error: Exception | None = None

    @property
    def watched(self) -> tuple[str, ...]:
        return (self.tables.upstream, *self.reads)

    @property
    def live(self) -> bool:
        return not self.summary.stopped_by


class Heads:
    """The latest version of each table the pool reads, looked at once per pass: a table is
    opened only when the commit after the version known exists (a stat), so an idle pass over
    fifty MVs of five upstreams costs five stats."""

    def __init__(self, storage_options) -> None:
        self.options = storage_options
        self.known: dict[str, int | None] = {}

    def refresh(self, uri: str) -> None:
        v = self.known.get(uri)
        if v is None or wait_for_commit(uri, v + 1, self.options, timeout=0):
            table = owned_tables.open_if_exists(uri, self.options)
            self.known[uri] = None if table is None else table.version()

    def of(self, uris: Sequence[str]) -> tuple[int | None, ...]:
        return tuple(self.known.get(u) for u in uris)

    def wait(self, uris: Sequence[str], timeout: float, stop: threading.Event) -> bool:
        """True as soon as any table has a commit past the version known; False after
        `timeout` or once `stop` is set."""
        tick = REMOTE_TICK_SECONDS if any("://" in u and not u.startswith("file://")
                                          for u in uris) else LOCAL_TICK_SECONDS
        deadline = time.monotonic() + timeout
        while True:
            for u in uris:
                v = self.known.get(u)
                if wait_for_commit(u, 0 if v is None else v + 1, self.options, timeout=0):
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or stop.wait(min(tick, left)):
                return False


def follow_many(spark: SparkSession, members: Sequence[PoolMember], *, stop: threading.Event,
                on_end: Callable[[PoolMember], None],
                poll_seconds: float = DEFAULT_POLL_SECONDS, max_barriers: int | None = None,
                log: Callable[[str], None] = print, hook: Hook = no_hook) -> None:
    """Run each member's barriers whenever it has work (see `follower.follow`: a new version
    of a table it reads, or unfinished vnodes while not paused), members in the given order
    (lineage order: an MV after the MVs it reads), until `stop` is set or every member has
    ended (its stop request, `max_barriers`, or its error: `on_end` is told at once, so the
    caller can say so while the others go on). Each member's `summary` says why it ended."""
    heads = Heads(members[0].tables.storage_options if members else {})
    while True:
        live = [m for m in members if m.live]
        if stop.is_set():
            for m in live:
                m.summary.stopped_by = "interrupt"
            return
        if not live:
            return
        watched = list(dict.fromkeys(u for m in live for u in m.watched))
        for u in watched:
            heads.refresh(u)
        ran = False
        for m in live:
            if stop.is_set():
                break
            ran |= _turn(spark, m, heads, max_barriers, on_end, log, hook)
        if not ran:
            heads.wait(watched, poll_seconds, stop)


def _turn(spark: SparkSession, m: PoolMember, heads: Heads, max_barriers: int | None,
          on_end: Callable[[PoolMember], None], log: Callable[[str], None],
          hook: Hook) -> bool:
    """One member's turn in a pass: end it, skip it (idle) or run its barrier. True when a
    barrier ran (or was attempted)."""
    if stop_request(m.tables) is not None:
        _end(m, "stop request", on_end)
        return False
    if max_barriers is not None and m.summary.barriers >= max_barriers:
        _end(m, "max barriers", on_end)
        return False
    now = heads.of(m.watched)
    if now[0] is None:
        return False  # its upstream does not exist yet
    # idle: nothing new, and finished or paused (the controls read only when unfinished)
    if now == m.done and (not m.unfinished or read_controls(m.tables).rate_limit == 0):
        return False
    try:
        report = run_barrier(spark, m.d, m.tables, m.vnodes, hook=hook)
    except ConcurrentBackfillRun as exc:
        m.summary.conflicts += 1
        m.conflicts += 1
        if m.conflicts < MAX_CONFLICTS:
            log(f"MV {m.d.name!r}: another run wrote vnodes of this follower ({exc}); retrying "
                f"at its next turn ({m.conflicts}/{MAX_CONFLICTS})")
            return False
        _fail(m, exc, on_end)
        return True
    except Exception as exc:  # noqa: BLE001 - one MV's failure must not stop the others
        _fail(m, exc, on_end)
        return True
    m.conflicts = 0
    m.summary.barriers += 1
    first_new = None if m.done is None or m.done[0] is None else m.done[0] + 1
    m.done, m.unfinished = (report.v_new, *now[1:]), not report.finished
    if m.tables.mv in heads.known:  # its readers in the pool see this commit in this pass
        heads.refresh(m.tables.mv)
    m.on_barrier(_record(m.d, m.tables, m.summary.barriers, report, first_new))
    return True


def _fail(m: PoolMember, exc: Exception, on_end: Callable[[PoolMember], None]) -> None:
    m.error = exc
    _end(m, f"failed: {type(exc).__name__}", on_end)


def _end(m: PoolMember, why: str, on_end: Callable[[PoolMember], None]) -> None:
    m.summary.stopped_by = why
    on_end(m)
