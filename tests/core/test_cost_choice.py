"""The pure cost model of a barrier over finished vnodes (core/cost_choice.py): which path it
chooses, that the choice moves the right way with the estimates, that the shortcut which skips
the vnodes' rows never changes an answer, and how measured costs are smoothed and kept."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.cost_choice import (
    APPLY,
    APPLY_FIXED_SECONDS,
    AUTO,
    CHOICES,
    MIN_SAMPLE_ROWS,
    RESNAPSHOT,
    RESNAPSHOT_FIXED_SECONDS,
    RESNAPSHOT_MARGIN,
    UnitCost,
    UnitCosts,
    apply_seconds,
    choose,
    resnapshot_seconds,
    vnode_rows_needed,
)
from backfill_assets.core.figures import compact_vnodes

ROWS = st.integers(0, 10**10)
RATE = st.floats(1e-9, 1e-2)
COSTS = st.builds(lambda a, r, n, m: UnitCosts(UnitCost(a, n), UnitCost(r, m)),
                  RATE, RATE, st.integers(0, 50), st.integers(0, 50))
VNODES = st.lists(st.integers(0, 4095), min_size=1, max_size=40, unique=True).map(
    lambda v: tuple(sorted(v)))


@given(ROWS, ROWS, VNODES, COSTS)
def test_auto_re_snapshots_exactly_when_re_reading_costs_less_by_the_margin(
        changes, rows, vnodes, costs):
    d = choose(changes, rows, vnodes, 7, costs)
    assert d.resnapshot == (resnapshot_seconds(rows, costs)
                            <= (1 - RESNAPSHOT_MARGIN) * apply_seconds(changes, costs))
    assert d.apply_seconds == pytest.approx(APPLY_FIXED_SECONDS
                                            + changes * costs.apply.seconds_per_row)
    assert d.resnapshot_seconds == pytest.approx(RESNAPSHOT_FIXED_SECONDS
                                                 + rows * costs.resnapshot.seconds_per_row)


@given(ROWS, ROWS, st.integers(0, 10**9), VNODES, COSTS)
def test_more_changes_never_turn_a_re_snapshot_into_applying(changes, rows, more, vnodes,
                                                             costs):
    if choose(changes, rows, vnodes, 1, costs).resnapshot:
        assert choose(changes + more, rows, vnodes, 1, costs).resnapshot


@given(ROWS, ROWS, st.integers(0, 10**9), VNODES, COSTS)
def test_more_vnode_rows_never_turn_applying_into_a_re_snapshot(changes, rows, more, vnodes,
                                                                costs):
    if not choose(changes, rows, vnodes, 1, costs).resnapshot:
        assert not choose(changes, rows + more, vnodes, 1, costs).resnapshot


@given(ROWS, ROWS, VNODES, COSTS)
def test_skipping_the_vnode_rows_never_changes_the_answer(changes, rows, vnodes, costs):
    """Where the choice does not need the vnodes' rows it applies, whatever they are."""
    if not vnode_rows_needed(changes, costs):
        assert not choose(changes, rows, vnodes, 1, costs).resnapshot
        assert not choose(changes, None, vnodes, 1, costs).resnapshot


@given(ROWS, ROWS, VNODES, COSTS, st.sampled_from([APPLY, RESNAPSHOT]))
def test_a_forced_choice_takes_its_path_and_records_both_estimates(changes, rows, vnodes,
                                                                   costs, forced):
    assert vnode_rows_needed(changes, costs, forced)
    d = choose(changes, rows, vnodes, 3, costs, forced)
    assert d.resnapshot == (forced == RESNAPSHOT)
    assert d.reason.startswith(f"forced by barrier_choice={forced}")
    meta = d.metadata()
    assert meta["barrier_choice_control"] == forced
    assert meta["estimated_change_rows"] == changes and meta["estimated_vnode_rows"] == rows


def test_the_reason_names_both_estimates_and_the_unit_costs() -> None:
    costs = UnitCosts(UnitCost(20e-6, 4), UnitCost(2e-6))
    d = choose(3_000_000, 10_000_000, tuple(range(256)), 42, costs)
    assert d.resnapshot and d.choice == "re-snapshot vnodes 0..255"
    assert d.reason == (
        "re-reading costs at most 90% of applying: applying ~3,000,000 change rows: ~60.15 s "
        "(20.00 us/row, 4 measured); re-reading ~10,000,000 vnode rows at v42: ~22.50 s "
        "(2.00 us/row, default)")
    small = choose(100, None, (3,), 9, costs)
    assert small.choice == "apply changes" and "vnode rows not estimated" in small.reason
    assert "estimated_vnode_rows" not in small.metadata()


def test_refusals() -> None:
    with pytest.raises(ValueError, match="barrier_choice 'sometimes'"):
        choose(1, 1, (0,), 1, UnitCosts(), "sometimes")
    with pytest.raises(ValueError, match="needs the vnodes' rows"):
        choose(10**9, None, (0,), 1, UnitCosts())
    with pytest.raises(ValueError, match="vnodes"):
        choose(1, 1, (), 1, UnitCosts())
    assert set(CHOICES) == {AUTO, APPLY, RESNAPSHOT}


@given(RATE, st.integers(0, 100), st.integers(MIN_SAMPLE_ROWS, 10**9),
       st.floats(1e-3, 1e5))
def test_a_measured_barrier_moves_the_figure_toward_its_own(rate, samples, rows, seconds):
    before = UnitCost(rate, samples)
    after = before.observed(rows, seconds, APPLY_FIXED_SECONDS)
    own = max(seconds - APPLY_FIXED_SECONDS, seconds / 10) / rows
    assert after.samples == samples + 1 and math.isfinite(after.seconds_per_row)
    low, high = sorted((rate, own))
    assert low * (1 - 1e-9) <= after.seconds_per_row <= high * (1 + 1e-9)


@given(RATE, st.integers(0, MIN_SAMPLE_ROWS - 1), st.floats(0, 1e5))
def test_a_barrier_too_small_to_say_changes_nothing(rate, rows, seconds):
    before = UnitCost(rate, 2)
    assert before.observed(rows, seconds, RESNAPSHOT_FIXED_SECONDS) == before


def test_the_first_samples_are_a_running_mean_then_a_moving_average() -> None:
    cost = UnitCost(1e-6)  # the default counts as one sample
    cost = cost.observed(1_000_000, APPLY_FIXED_SECONDS + 4.0, APPLY_FIXED_SECONDS)
    assert cost.seconds_per_row == pytest.approx(2e-6) and cost.samples == 1  # geometric mean
    for _ in range(40):
        cost = cost.observed(1_000_000, APPLY_FIXED_SECONDS + 8.0, APPLY_FIXED_SECONDS)
    assert cost.seconds_per_row == pytest.approx(8e-6, rel=1e-3)  # it follows the machine


@given(COSTS)
def test_costs_round_trip_through_their_document(costs):
    assert UnitCosts.from_json(costs.to_json()) == costs


@pytest.mark.parametrize("doc", [None, {}, {"apply": "fast"}, {"apply": {"seconds_per_row": -1}},
                                 {"resnapshot": {"seconds_per_row": float("nan")}},
                                 {"apply": {"seconds_per_row": 1e-6, "samples": "many"}}])
def test_a_document_that_says_nothing_usable_gives_the_defaults(doc):
    assert UnitCosts.from_json(doc) == UnitCosts()
    with pytest.raises(ValueError, match="unknown barrier path"):
        UnitCosts().observed("merge", MIN_SAMPLE_ROWS, 1.0)


def test_compact_vnodes() -> None:
    assert compact_vnodes((0, 1, 2, 3, 7, 9, 10, 11, 12)) == "0..3, 7, 9..12"
    assert compact_vnodes((5,)) == "5"
