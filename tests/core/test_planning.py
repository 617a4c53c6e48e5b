"""Step planning: replicate / forward / read per vnode, controls, versions and errors."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import (
    InconsistentSharedPosition,
    InvalidControl,
    InvalidProgressTransition,
    InvalidVnode,
)
from backfill_assets.core.keys import Bound, KeyColumn, KeyOrder
from backfill_assets.core.planning import StepPlan, VnodeStepPlan, commit_step, plan_step
from backfill_assets.core.positions import PerVnodePositions, SharedPosition
from backfill_assets.core.progress import (
    BackfillState,
    Completed,
    InProgress,
    ProgressWrite,
)

KO = KeyOrder((KeyColumn("k", "int"),))
ARR, SHARED = PerVnodePositions(), SharedPosition()


def mixed() -> BackfillState:
    """vnode 0 NotStarted, 1 InProgress at 5 (v3), 2 Completed (v4)."""
    return BackfillState(KO, [0, 1, 2], {1: (InProgress((5,), 2), 3),
                                         2: (Completed((9,), 4), 4)})


def test_arrangement_plan_per_vnode() -> None:
    plan = plan_step(mixed(), ARR, [2, 0, 1], {1: 3, 2: 1}, 6, 10, None)
    assert plan == StepPlan(
        v_new=6,
        vnodes=(
            VnodeStepPlan(0, None, None, True, True, Bound(None)),
            VnodeStepPlan(1, 3, 3, True, True, Bound((5,))),
            VnodeStepPlan(2, None, 4, False, False, None),
        ),
        chunk_limit=10,
        paused=False,
        shared_read=False,
        chunk_tail=2,  # unthrottled: a vnode whose rest is 12 rows or fewer reads it whole
    )
    assert plan.forward_since == {0: None, 1: 3, 2: 4}
    assert plan.snapshot_vnodes == [0, 1] and plan.replicate_vnodes == [0, 1]
    assert plan.plan_for(1).forward_from == 3
    with pytest.raises(KeyError):
        plan.plan_for(7)


def test_arrangement_may_plan_a_subset_of_its_vnodes() -> None:
    plan = plan_step(mixed(), ARR, [1], {}, 6, 10, None)
    assert [p.vnode for p in plan.vnodes] == [1]
    assert plan.plan_for(1).replicate_from is None  # replica not initialised: copy at v_new


def test_no_shuffle_reads_upstream_directly() -> None:
    s = BackfillState(KO, [0, 1], {0: (InProgress((5,), 1), 2), 1: (InProgress((5,), 0), 2)})
    plan = plan_step(s, SHARED, [0, 1], {}, 2, 10, 4)
    assert plan.shared_read and plan.chunk_limit == 4
    assert all(not p.replicate and p.replicate_from is None for p in plan.vnodes)
    assert [p.bound for p in plan.vnodes] == [Bound((5,)), Bound((5,))]


def test_paused_stops_the_snapshot_but_keeps_forwarding() -> None:
    plan = plan_step(mixed(), ARR, [0, 1, 2], {}, 6, 10, 0)
    assert plan.paused and plan.chunk_limit == 0
    assert plan.snapshot_vnodes == []
    assert plan.forward_since == {0: None, 1: 3, 2: 4}
    assert plan.replicate_vnodes == [0, 1]  # the replica stays current while paused


@pytest.mark.parametrize(
    ("strategy", "rate_limit", "expected"),
    [(ARR, None, 10), (ARR, 50, 10), (ARR, 6, 3), (ARR, 1, 1), (SHARED, 6, 6),
     (SHARED, 50, 10)],
)
def test_chunk_limit_follows_the_rate_limit(strategy, rate_limit, expected) -> None:
    s = BackfillState(KO, [0, 1])  # two unfinished vnodes
    assert plan_step(s, strategy, [0, 1], {}, 1, 10, rate_limit).chunk_limit == expected


@pytest.mark.parametrize(("strategy", "chunk_size", "rate_limit", "tail"),
                         [(ARR, 80, None, 20), (ARR, 80, 100, 0), (SHARED, 80, None, 0)])
def test_only_unthrottled_per_vnode_reads_have_a_tail(strategy, chunk_size, rate_limit, tail):
    s = BackfillState(KO, [0, 1])
    assert plan_step(s, strategy, [0, 1], {}, 1, chunk_size, rate_limit).chunk_tail == tail


def test_finished_run_reads_nothing() -> None:
    s = BackfillState(KO, [0], {0: (Completed((1,), 1), 2)})
    plan = plan_step(s, ARR, [0], {}, 2, 10, None)
    assert plan.snapshot_vnodes == [] and plan.forward_since == {0: 2}


def test_barrier_may_repeat_but_never_go_back() -> None:
    plan_step(mixed(), ARR, [1, 2], {}, 4, 10, None)
    with pytest.raises(InvalidProgressTransition, match="vnode 2 is at version 4, the barrier 3"):
        plan_step(mixed(), ARR, [2], {}, 3, 10, None)
    with pytest.raises(InvalidProgressTransition, match="barrier version -1"):
        plan_step(mixed(), ARR, [2], {}, -1, 10, None)


def test_replica_ahead_of_the_barrier_is_refused() -> None:
    with pytest.raises(InvalidProgressTransition, match="replicated_state of vnode 1 is at "
                       "version 9, after the barrier 6"):
        plan_step(mixed(), ARR, [1], {1: 9}, 6, 10, None)
    with pytest.raises(InvalidProgressTransition, match="version -1"):
        plan_step(mixed(), ARR, [1], {1: -1}, 6, 10, None)
    plan_step(mixed(), ARR, [2], {2: 9}, 6, 10, None)  # Completed: its replica is unused


@pytest.mark.parametrize(("chunk_size", "rate_limit"), [(0, None), (10, -1), (None, 5)])
def test_bad_controls(chunk_size, rate_limit) -> None:
    with pytest.raises(InvalidControl):
        plan_step(mixed(), ARR, [0], {}, 6, chunk_size, rate_limit)


def test_vnodes_outside_the_state_are_refused() -> None:
    with pytest.raises(InvalidVnode, match="vnode 7 is not part of this run"):
        plan_step(mixed(), ARR, [0, 7], {}, 6, 10, None)


def test_no_shuffle_plans_its_whole_run() -> None:
    s = BackfillState(KO, [0, 1, 2])
    with pytest.raises(InconsistentSharedPosition, match="must cover all 3 vnodes .*got 2"):
        plan_step(s, SHARED, [0, 1], {}, 1, 10, None)
    with pytest.raises(InconsistentSharedPosition):
        plan_step(mixed(), SHARED, [0, 1, 2], {}, 6, 10, None)


def test_progress_without_a_version_cannot_be_planned() -> None:
    s = BackfillState(KO, [0])
    s.update(0, (1,), 1)
    with pytest.raises(InvalidProgressTransition, match="progress but no version"):
        plan_step(s, ARR, [0], {}, 1, 10, None)


def test_commit_step_advances_the_plans_vnodes_and_returns_the_writes() -> None:
    s = mixed()
    plan = plan_step(s, ARR, [0, 1, 2], {}, 6, 10, None)
    s.update(1, (8,), 3)
    writes = commit_step(s, plan)
    assert writes == [
        ProgressWrite(1, "update", InProgress((8,), 5), 6),
        ProgressWrite(2, "update", Completed((9,), 4), 6),
    ]  # vnode 0 read nothing yet: still NotStarted, no row
    s.mark_committed()
    assert [s.version(v) for v in (0, 1, 2)] == [None, 6, 6]
