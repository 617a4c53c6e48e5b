"""Position strategies: chunk limits, applying snapshot chunks, shared-position recovery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.errors import (
    InconsistentSharedPosition,
    InvalidControl,
    InvalidProgressTransition,
    InvalidSnapshotChunk,
)
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.positions import (
    PerVnodePositions,
    PositionStrategy,
    SharedPosition,
    VnodeChunk,
    check_controls,
    chunk_cut,
    chunk_tail,
    chunk_window,
    effective_chunk_size,
    keep_rows,
    rows_to_see,
)
from backfill_assets.core.progress import BackfillState, Completed, InProgress, NotStarted
from backfill_assets.core.snapshot import BulkPositions

KO = KeyOrder((KeyColumn("k", "int", descending=True),))
NULL = (None,)
ARR, SHARED = PerVnodePositions(), SharedPosition()


def state(**recovered) -> BackfillState:
    """vnodes 0..2; recovered as v0=(progress, version)."""
    return BackfillState(KO, [0, 1, 2], {int(k[1:]): v for k, v in recovered.items()})


def test_strategies_implement_the_protocol() -> None:
    strategies: list[PositionStrategy] = [ARR, SHARED, BulkPositions()]
    assert [(s.name, s.uses_replica, s.shared, s.bulk) for s in strategies] == [
        ("arrangement", True, False, False), ("no_shuffle", False, True, False),
        ("snapshot", False, False, True)
    ]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, None])
def test_chunk_size_must_be_positive(bad) -> None:
    with pytest.raises(InvalidControl, match=f"chunk_size {bad!r} must be an int >= 1"):
        check_controls(bad, None)


@pytest.mark.parametrize("bad", [-1, True, 2.5, "10"])
def test_rate_limit_must_be_none_zero_or_positive(bad) -> None:
    with pytest.raises(InvalidControl, match=r"None \(unlimited\), 0 \(paused\)"):
        check_controls(10, bad)


@pytest.mark.parametrize(
    ("chunk_size", "rate_limit", "expected"),
    [(10, None, 10), (10, 0, 0), (10, 3, 3), (10, 10, 10), (10, 50, 10), (1, 1, 1)],
)
def test_a_rate_limit_below_the_chunk_size_takes_precedence(chunk_size, rate_limit, expected):
    assert effective_chunk_size(chunk_size, rate_limit) == expected
    assert SHARED.chunk_limit(chunk_size, rate_limit, 5) == expected


@pytest.mark.parametrize(
    ("chunk_size", "rate_limit", "unfinished", "expected"),
    [
        (10, None, 4, 10), (10, 0, 4, 0), (10, 8, 4, 2), (10, 3, 4, 1), (10, 100, 4, 10),
        (10, 8, 0, 8), (10, 7, 1, 7),
    ],
)
def test_per_vnode_limit_shares_the_rate_limit(chunk_size, rate_limit, unfinished, expected):
    assert ARR.chunk_limit(chunk_size, rate_limit, unfinished) == expected


# --- arrangement -----------------------------------------------------------------------------


def test_arrangement_full_chunk_moves_exhausted_chunk_finishes() -> None:
    s = state(v1=(InProgress((9,), 2), 1))
    ARR.apply_chunk(s, {0: VnodeChunk(3, (20,)), 1: VnodeChunk(2, (5,), exhausted=True)}, 3)
    assert s.current(0) == InProgress((20,), 3)
    assert s.current(1) == Completed((5,), 4)
    assert s.current(2) == NotStarted()  # not read: unchanged


def test_arrangement_exhausted_empty_read_finishes() -> None:
    s = state(v1=(InProgress((9,), 2), 1))
    ARR.apply_chunk(s, {0: VnodeChunk(0, None, True), 1: VnodeChunk(0, None, True)}, 3)
    assert s.current(0) == Completed(NULL, 0)
    assert s.current(1) == Completed((9,), 2)


@pytest.mark.parametrize("chunk", [VnodeChunk(0, None), VnodeChunk(2, (5,))])
def test_arrangement_refuses_a_short_chunk_not_said_exhausted(chunk) -> None:
    """Without a tail a chunk that leaves rows behind is exactly the limit: a short one that
    does not say it was the vnode's rest is a reader's bug, never taken as the end."""
    s = state()
    with pytest.raises(InvalidSnapshotChunk, match="was not exhausted"):
        ARR.apply_chunk(s, {0: chunk}, 3)
    assert s.current(0) == NotStarted()


def test_arrangement_chunks_may_end_at_a_file_boundary_within_the_tail() -> None:
    """With a tail, a chunk that leaves rows behind holds limit +- tail rows (it ended where
    a replica file ends); outside that window it is refused."""
    s = state()
    ARR.apply_chunk(s, {0: VnodeChunk(6, (20,)), 1: VnodeChunk(10, (7,))}, 8, 2)
    assert s.current(0) == InProgress((20,), 6)
    assert s.current(1) == InProgress((7,), 10)
    with pytest.raises(InvalidSnapshotChunk, match="returns at least 6"):
        ARR.apply_chunk(state(), {0: VnodeChunk(5, (1,))}, 8, 2)


def test_arrangement_position_must_grow() -> None:
    s = state(v0=(InProgress((9,), 2), 1))
    with pytest.raises(InvalidProgressTransition):
        ARR.apply_chunk(s, {0: VnodeChunk(1, (10,), True)}, 3)  # 10 sorts before 9 (desc.)


def test_arrangement_refuses_more_rows_than_the_limit() -> None:
    with pytest.raises(InvalidSnapshotChunk, match="vnode 0 returned 4 rows but the limit was 3"):
        ARR.apply_chunk(state(), {0: VnodeChunk(4, (1,))}, 3)


def test_arrangement_takes_a_vnodes_last_sliver_with_its_last_chunk() -> None:
    """More than ``limit`` rows (at most ``limit + tail``) are a vnode's whole rest: it
    finishes; exactly ``limit`` may leave rows behind: it goes on."""
    s = state(v1=(InProgress((9,), 2), 1))
    ARR.apply_chunk(s, {0: VnodeChunk(8, (20,)), 1: VnodeChunk(5, (1,), True),
                        2: VnodeChunk(9, (3,), True)}, 8, 1)
    assert s.current(0) == InProgress((20,), 8)
    assert s.current(1) == Completed((1,), 7)
    assert s.current(2) == Completed((3,), 9)
    with pytest.raises(InvalidSnapshotChunk, match=r"returned 10 rows but the limit was 8 \(\+1"):
        ARR.apply_chunk(state(), {0: VnodeChunk(10, (1,))}, 8, 1)


@pytest.mark.parametrize(("limit", "rate_limit", "tail"),
                         [(4096, None, 1024), (3, None, 0), (4096, 5000, 0), (4096, 0, 0)])
def test_the_tail_is_a_quarter_of_a_chunk_and_none_when_throttled(limit, rate_limit, tail):
    assert chunk_tail(limit, rate_limit) == tail


@pytest.mark.parametrize(("remaining", "whole", "kept"),
                         [(5, True, 5), (8, True, 8), (10, True, 10), (11, True, 8),
                          (10, False, 8), (5, False, 5)])
def test_a_read_keeps_a_whole_rest_up_to_the_tail(remaining, whole, kept) -> None:
    assert keep_rows(remaining, 8, 2, whole) == kept
    assert rows_to_see(8, 2) == 11 and rows_to_see(8, 0) == 8


@pytest.mark.parametrize(("remaining", "whole", "boundaries", "cut"), [
    (10, True, [4, 9], (10, True)),  # a whole rest within limit + tail: all of it
    (20, True, [4, 9], (9, False)),  # else the largest file boundary in 6..10
    (20, False, [6, 11], (6, False)),
    (20, False, [4, 11], (8, False)),  # no boundary in the window: exactly the limit
    (20, False, [], (8, False)),
    (9, False, [10], (8, False)),  # a boundary past what was read is not one
])
def test_a_chunk_ends_at_a_file_boundary_in_its_window(remaining, whole, boundaries, cut):
    assert chunk_cut(remaining, 8, 2, whole, boundaries) == cut
    assert chunk_window(8, 2) == (6, 10) and chunk_window(8, 0) == (8, 8)


@given(st.integers(0, 60), st.integers(1, 20), st.integers(0, 5), st.booleans(),
       st.lists(st.integers(0, 60), max_size=4))
def test_chunk_cut_is_always_a_chunk_apply_chunk_takes(remaining, limit, tail, whole, ends):
    """Whatever the reader saw, what ``chunk_cut`` keeps is accepted by ``apply_chunk``: a
    count in the window, or the exhausted rest of the vnode; and never more than was read."""
    keep, exhausted = chunk_cut(remaining, limit, tail, whole, sorted(ends))
    assert 0 <= keep <= remaining
    assert exhausted == (whole and remaining <= limit + tail)
    if exhausted or keep < max(1, limit - tail):
        return  # a non-whole read shorter than the window is never produced (the seek)
    s = state()
    ARR.apply_chunk(s, {0: VnodeChunk(keep, (keep,) if keep else None, exhausted)}, limit, tail)
    if exhausted:
        assert s.current(0) == (Completed((keep,), keep) if keep else Completed(NULL, 0))
    else:
        assert s.current(0) == InProgress((keep,), keep)


@pytest.mark.parametrize("strategy", [ARR, SHARED])
def test_paused_reads_nothing(strategy) -> None:
    s = state()
    strategy.apply_chunk(s, {0: VnodeChunk(0, None)}, 0)
    assert s.current(0) == NotStarted()  # an unread vnode is not exhausted
    with pytest.raises(InvalidSnapshotChunk, match="paused"):
        strategy.apply_chunk(s, {0: VnodeChunk(1, (1,))}, 0)


@pytest.mark.parametrize("strategy", [ARR, SHARED])
@pytest.mark.parametrize("chunk", [VnodeChunk(1, None), VnodeChunk(0, (1,)), VnodeChunk(-1, None)])
def test_chunk_must_be_consistent(strategy, chunk) -> None:
    with pytest.raises(InvalidSnapshotChunk, match="last_key exactly when rows > 0"):
        strategy.apply_chunk(state(), {0: chunk}, 3)


@pytest.mark.parametrize("strategy", [ARR, SHARED])
def test_completed_vnodes_are_not_read(strategy) -> None:
    s = state(v0=(Completed((1,), 1), 1))
    with pytest.raises(InvalidSnapshotChunk, match="vnode 0 is Completed but a snapshot chunk"):
        strategy.apply_chunk(s, {0: VnodeChunk(0, None)}, 3)


def test_arrangement_recovers_any_mix() -> None:
    s = state(v0=(Completed((1,), 1), 1), v1=(InProgress((3,), 1), 2))
    assert ARR.recover(s) is None


# --- no_shuffle ------------------------------------------------------------------------------


def test_shared_position_is_the_max_last_key_and_every_vnode_moves() -> None:
    s = state()
    SHARED.apply_chunk(s, {0: VnodeChunk(2, (8,)), 1: VnodeChunk(2, (6,))}, 4)
    assert s.progress_map() == {  # descending: 6 is after 8
        0: InProgress((6,), 2), 1: InProgress((6,), 2), 2: InProgress((6,), 0)
    }
    assert SHARED.recover(s) == (6,)


def test_shared_short_chunk_finishes_every_vnode() -> None:
    s = state(**{f"v{v}": (InProgress((9,), 1), 3) for v in (0, 1, 2)})
    SHARED.apply_chunk(s, {2: VnodeChunk(1, (4,))}, 4)
    assert s.progress_map() == {0: Completed((4,), 1), 1: Completed((4,), 1),
                                2: Completed((4,), 2)}


def test_shared_empty_snapshot_finishes_with_the_placeholder() -> None:
    s = state()
    SHARED.apply_chunk(s, {}, 4)
    assert set(s.progress_map().values()) == {Completed(NULL, 0)}


def test_shared_refuses_more_rows_than_the_limit() -> None:
    with pytest.raises(InvalidSnapshotChunk, match="returned 5 rows but the limit was 4"):
        SHARED.apply_chunk(state(), {0: VnodeChunk(3, (1,)), 1: VnodeChunk(2, (2,))}, 4)


def test_shared_recover_accepts_agreeing_states() -> None:
    assert SHARED.recover(state()) is None
    finished = {f"v{v}": (Completed((v,), 1), 3) for v in (0, 1, 2)}
    assert SHARED.recover(state(**finished)) is None  # all done: positions no longer matter


def test_shared_recover_refuses_a_mix_of_finished_and_unfinished() -> None:
    s = state(v0=(Completed((1,), 1), 1), v1=(InProgress((1,), 1), 1),
              v2=(InProgress((1,), 1), 1))
    with pytest.raises(InconsistentSharedPosition) as e:
        SHARED.recover(s)
    msg = str(e.value)
    assert "[0] are finished but [1, 2] are not" in msg
    assert "Run the same vnode range as before" in msg and "drop the MV's state" in msg


@pytest.mark.parametrize(
    "recovered",
    [
        {"v0": (InProgress((1,), 1), 1), "v1": (InProgress((2,), 1), 1),
         "v2": (InProgress((1,), 1), 1)},
        {"v0": (InProgress((1,), 1), 1)},  # the others are NotStarted: no position
    ],
)
def test_shared_recover_refuses_different_positions(recovered) -> None:
    with pytest.raises(InconsistentSharedPosition, match="different positions .*0: "):
        SHARED.recover(state(**recovered))
