"""A rate limit of R snapshot rows per second, kept over minutes, not per step (a token bucket).

Why: a step that read at most one second's worth (R rows) and slept out the second would,
with a Dagster run per barrier (a launch and a JVM start between barriers), deliver a small
fraction of R: the time between steps would count against the rate. Here the rows a
rate-limited barrier may read are the rate times the time since the rows already read were
due (the pace's *anchor*), at most MAX_CREDIT_SECONDS of it and at least one second of it
(the step waits for that). The bucket holds at most MAX_CREDIT_SECONDS of credit, a fifth of
a minute, so no 60 s window reads more than 1.2 times its share: time nobody read in (a
stall, the gap between two runs) is lost beyond that, never repaid in a burst.
- within a barrier, step after step for `BARRIER_SECONDS` (a Dagster run: launching one costs
  seconds, so one run reads about a minute's worth before the next barrier's run), each step
  reading what came due while the previous one ran;
- across barriers, the anchor is where the pace left it in this process (the follower runs its
  barriers in one process), else the progress table's latest commit (a new run: the gap
  since the previous run is credited up to the bucket's size), never before the controls'
  last change (a resume or a new rate does not spend credit from before it).
R per step is still a ceiling per vnode too: a step reads at most `chunk_size` rows per vnode,
so a chunk size below R / unfinished vnodes bounds the rate instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import controls_changed_at
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.modes import run_mode_barrier
from backfill_assets.step.request import Hook, StepReport, StepRequest, merged
from backfill_assets.storage import LRU

MAX_CREDIT_SECONDS = 12.0  # the bucket: a fifth of a 60 s window (see the module docstring)
MIN_CREDIT_SECONDS = 1.0  # a step waits for at least a second's worth
BARRIER_SECONDS = 60.0  # how long a rate-limited barrier of a Dagster run keeps stepping

@dataclass
class Pace:
    """The token bucket of one vnode range: R rows per second from `anchor` on."""

    rate: int
    since: float | None  # the controls' change it was started under
    anchor: float  # wall clock (s) up to which the rows read were due

    def credit(self, now: float) -> float:
        return min(now - self.anchor, MAX_CREDIT_SECONDS)

    def spend(self, rows: int, now: float) -> None:
        self.anchor = max(self.anchor, now - MAX_CREDIT_SECONDS) + rows / self.rate


# this process's, per (MV, vnode range)
_PACES: LRU[tuple[str, tuple[int, ...]], Pace] = LRU(1024, name="rate-limit paces")


def pace_for(tables: MVTables, vnodes: tuple[int, ...], rate: int) -> Pace:
    """This process's pace of the range, or a new one anchored as the module docstring says."""
    since = controls_changed_at(tables)
    key = (tables.root, tuple(sorted(vnodes)))
    pace = _PACES.get(key)
    if pace is None or pace.rate != rate or pace.since != since:
        now = time.time()
        known = [t for t in (_last_commit(tables), since) if t is not None]
        anchor = min(max(known), now - MIN_CREDIT_SECONDS) if known else \
            now - MIN_CREDIT_SECONDS
        pace = Pace(rate, since, anchor)
        _PACES.put(key, pace)
    return pace


def paced(spark: SparkSession, req: StepRequest, hook: Hook,
          seconds: float = BARRIER_SECONDS) -> StepReport:
    """A barrier under the rate limit `req.rate_limit`: barriers of the request's mode, each
    reading what came due (`req.rate_limit` becomes that step's row budget), for `seconds`
    (0: one step) or until every vnode is finished or a step reads nothing; one report for
    all of them."""
    rate = req.rate_limit
    assert rate, "paced() is for a positive rate limit"
    pace = pace_for(req.tables, req.vnodes, rate)
    started, reports = time.monotonic(), []
    while True:
        wait = pace.anchor + MIN_CREDIT_SECONDS - time.time()
        if wait > 0:
            time.sleep(wait)
        budget = max(1, int(rate * pace.credit(time.time())))
        step_started = time.monotonic()
        report = run_mode_barrier(spark, replace(req, rate_limit=budget), hook)
        throttle(budget, report.snapshot_rows, step_started)
        pace.spend(report.snapshot_rows, time.time())
        reports.append(report)
        if report.finished or not report.snapshot_rows or \
                time.monotonic() - started >= seconds:
            break
    out = merged(reports)
    out.extra["paced_steps"] = len(reports)
    out.extra["rate_limit_rows_per_second"] = rate
    if "snapshot_path" in out.extra:  # snapshot mode's chunked path: name the rate, not a budget
        out.extra["snapshot_path"] = f"chunked (arrangement steps): rate limit {rate} rows/s"
    return out


def throttle(rate_limit: int | None, rows: int, started: float) -> None:
    """Sleep so a step that read `rows` at a budget of `rate_limit` rows per second lasts at
    least the time those rows are worth (`started`: its monotonic start): a barrier's last
    step, which no next step waits behind, keeps the rate too."""
    if rate_limit and rows:
        time.sleep(max(0.0, rows / rate_limit - (time.monotonic() - started)))


def _last_commit(tables: MVTables) -> float | None:
    """When the progress table last committed (s), None before its first commit."""
    progress = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    if progress is None:
        return None
    history = progress.history(1)
    stamp = history[0].get("timestamp") if history else None
    return None if stamp is None else stamp / 1000.0
