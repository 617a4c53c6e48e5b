"""Progress figures: percent done, rows/s over wall clock, ETA (none while paused), lag."""

from __future__ import annotations

import pytest

from backfill_assets.core.figures import (
    BACKFILLING,
    FINISHED,
    IN_PROGRESS,
    MAINTAINING,
    PAUSED,
    MVFigures,
    RateSample,
    recent_rate,
    state_ranges,
)


def _figs(**kw) -> MVFigures:
    base = dict(snapshot_rows_done=250, upstream_rows=1000, vnode_count=8, vnodes_finished=2,
                vnodes_started=5, paused=False, rows_per_second=50.0, upstream_version=12,
                mv_version=10, lag_seconds=3.5)
    return MVFigures(**{**base, **kw})


def test_eta_is_remaining_rows_over_the_recent_rate():
    figs = _figs()
    assert figs.percent_done == 25.0 and figs.eta_seconds == 15.0
    assert figs.state == BACKFILLING and figs.lag_versions == 2


def test_no_eta_while_paused_or_before_a_rate_is_known():
    paused = _figs(paused=True, rows_per_second=0.0)
    assert paused.eta_seconds is None and paused.state == PAUSED
    assert _figs(paused=True).eta_seconds is None  # a stale rate must not make one up
    # a paused barrier records no rate: the barriers' before the pause beside `paused` lied
    assert _figs(paused=True, rows_per_second=3211.0).rows_per_second == 0.0
    assert _figs(rows_per_second=0.0).eta_seconds is None


def test_finished_is_100_percent_whatever_the_row_estimate_says():
    done = _figs(vnodes_finished=8, vnodes_started=8, snapshot_rows_done=990, paused=True)
    assert done.percent_done == 100.0 and done.eta_seconds == 0.0 and done.state == MAINTAINING
    assert _figs(snapshot_rows_done=5000).percent_done == 99.9  # never 100 while unfinished
    assert _figs(upstream_rows=0).percent_done == 0.0
    assert _figs(mv_version=None).lag_versions is None


def test_recent_rate_uses_wall_clock_between_commits():
    assert recent_rate([]) == 0.0 and recent_rate([RateSample(10.0, 5)]) == 0.0
    assert recent_rate([RateSample(20.0, 300), RateSample(10.0, 100)]) == pytest.approx(20.0)
    assert recent_rate([RateSample(10.0, 100), RateSample(10.0, 300)]) == 0.0
    assert recent_rate([RateSample(10.0, 300), RateSample(20.0, 300)]) == 0.0  # paused


def test_state_ranges_name_every_vnode_in_a_few_words():
    states = {0: FINISHED, 1: FINISHED, 2: IN_PROGRESS, 4: FINISHED, 5: IN_PROGRESS}
    assert state_ranges(states, 8) == \
        "finished 0..1, 4; in progress 2, 5; not started 3, 6..7"
    assert state_ranges({}, 4) == "not started 0..3"
    assert state_ranges({v: FINISHED for v in range(3)}, 3) == "finished 0..2"
