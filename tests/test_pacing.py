"""The rate limit's pace (barrier/pacing.py) with a stand-in step: rows per second over time, not
per step, whatever a step costs; no credit from before a controls change."""

from __future__ import annotations

import time
from dataclasses import replace

from backfill_assets.barrier import pacing
from backfill_assets.core.progress import InProgress
from backfill_assets.mv.controls import Controls, write_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.modes import mode_named
from backfill_assets.step.request import StepReport, StepRequest
from backfill_assets.storage import clear_all
from tests.support import simple_mv

RATE = 2000


def _request(warehouse: str) -> StepRequest:
    d = simple_mv(4)
    tables = MVTables.under(warehouse, d.name, "orders")
    write_controls(tables, Controls(rate_limit=RATE))
    return StepRequest(d, mode_named(d.mode), tables, (0, 1, 2, 3), 10**9, RATE)


def _step(cost: float, reads: list[int]):
    """A step that takes `cost` seconds and reads its whole budget (the request's rate)."""

    def run(spark, req, hook) -> StepReport:
        time.sleep(cost)
        reads.append(req.rate_limit)
        return StepReport(0, req.vnodes, req.rate_limit, snapshot_rows=req.rate_limit,
                          seconds=cost,
                          progress={v: InProgress((1,), 1) for v in req.vnodes},
                          versions=dict.fromkeys(req.vnodes, 0))

    return run


def paced(monkeypatch, req: StepRequest, step, seconds: float) -> StepReport:
    """`pacing.paced` over the stand-in `step` in place of the mode's barrier."""
    monkeypatch.setattr(pacing, "run_mode_barrier", step)
    return pacing.paced(None, req, lambda p: None, seconds=seconds)


def test_a_barrier_delivers_the_rate_however_slow_its_steps(warehouse, monkeypatch):
    """Steps of 1.5 s (slower than a second's worth of rows) still deliver the
    rate: each reads what came due while the previous one ran."""
    clear_all()
    req, reads = _request(warehouse), []
    started = time.time()
    report = paced(monkeypatch, req, _step(1.5, reads), seconds=6.0)
    elapsed = time.time() - started
    assert report.extra["paced_steps"] == len(reads) >= 3
    assert report.snapshot_rows == sum(reads)
    assert abs(report.snapshot_rows / elapsed - RATE) / RATE < 0.2, (reads, elapsed)
    assert RATE <= reads[0] <= 1.1 * RATE  # the first step after the change: a second's worth


def test_a_gap_is_credited_only_up_to_the_bucket_no_catch_up_burst(warehouse, monkeypatch):
    """A new process (a Dagster run) anchors at the progress table's last commit: a short gap
    since the previous run is credited, a long one only up to MAX_CREDIT_SECONDS, a fifth of
    a 60 s window, so no window reads more than 1.2 times the rate (the rest is lost)."""
    assert pacing.MAX_CREDIT_SECONDS <= 0.2 * 60
    clear_all()
    req = _request(warehouse)
    monkeypatch.setattr(pacing, "controls_changed_at", lambda tables: time.time() - 3600)
    monkeypatch.setattr(pacing, "_last_commit", lambda tables: time.time() - 8.0)
    reads: list[int] = []
    paced(monkeypatch, req, _step(0.0, reads), seconds=0)
    assert 7.5 * RATE <= reads[0] <= 8.5 * RATE
    for gap in (35.0, 7200.0):  # a gap between two sensor runs; a day's pause
        clear_all()
        monkeypatch.setattr(pacing, "_last_commit", lambda tables, gap=gap: time.time() - gap)
        paced(monkeypatch, req, _step(0.0, reads), seconds=0)
        assert reads[-1] == int(pacing.MAX_CREDIT_SECONDS * RATE)


def test_a_controls_change_starts_a_new_pace(warehouse, monkeypatch):
    """A resume (or a new rate) spends no credit from before it: one second's worth first."""
    clear_all()
    req = _request(warehouse)
    monkeypatch.setattr(pacing, "_last_commit", lambda tables: time.time() - 30.0)
    reads: list[int] = []
    write_controls(req.tables, Controls(rate_limit=RATE))  # changed just now
    paced(monkeypatch, replace(req), _step(0.0, reads), seconds=0)
    assert len(reads) == 1 and RATE <= reads[0] <= 1.1 * RATE
