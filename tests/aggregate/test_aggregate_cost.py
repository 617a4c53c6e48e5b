"""The aggregate barrier's cost choice (aggregate/cost.py): a small change applies, a change
about the size of the upstream recomputes, a forced choice wins, the driver's bound holds."""

from __future__ import annotations

from backfill_assets.aggregate.cost import DRIVER_CHANGE_ROWS, RECOMPUTE, choose
from backfill_assets.core.cost_choice import APPLY


def test_small_changes_apply_and_a_rewrite_recomputes():
    small = choose(change_rows=100, upstream_rows=10_000_000)
    assert small.path == APPLY and small.apply_seconds < small.recompute_seconds
    rewrite = choose(change_rows=2_000_000, upstream_rows=1_000_000)
    assert rewrite.path == RECOMPUTE and rewrite.recompute_seconds < rewrite.apply_seconds
    figures = rewrite.figures()
    assert figures["aggregate_path"] == RECOMPUTE and figures["change_rows_estimate"] == 2_000_000


def test_a_forced_choice_and_the_driver_bound():
    assert choose(10, 10**9, forced="resnapshot").path == RECOMPUTE
    assert choose(10**9, 10, forced="apply").path == APPLY
    assert choose(10, 10**9, forced="auto").path == APPLY
    assert choose(DRIVER_CHANGE_ROWS + 1, 10**12).path == RECOMPUTE
