"""Every progress transition, the commit plan, recovery validation and their errors."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import (
    CorruptProgressRow,
    InvalidKeyValue,
    InvalidProgressTransition,
    InvalidVnode,
)
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.progress import (
    BackfillState,
    Completed,
    InProgress,
    NotStarted,
    ProgressWrite,
    check_progress,
    check_vnode,
)

KO = KeyOrder((KeyColumn("a", "int"), KeyColumn("b", "string", descending=True)))
NULL = (None, None)


def fresh(*vnodes: int) -> BackfillState:
    return BackfillState(KO, vnodes or (0,))


def test_progress_values() -> None:
    assert NotStarted().current_pos is None and NotStarted().row_count == 0
    assert not NotStarted().finished and not InProgress((1, "a"), 2).finished
    assert Completed((1, "a"), 2).finished


def test_new_vnodes_are_not_started() -> None:
    s = fresh(3, 1, 1)
    assert s.vnodes == (1, 3)
    assert s.current(1) == s.committed(1) == NotStarted()
    assert s.version(1) is None and s.current_version(1) is None
    assert s.unfinished_vnodes() == [1, 3] and not s.is_finished()
    assert s.snapshot_rows() == 0 and s.commit_plan() == []


def test_update_from_not_started_then_in_progress() -> None:
    s = fresh()
    s.update(0, (1, "z"), 3)
    assert s.current(0) == InProgress((1, "z"), 3)
    assert s.committed(0) == NotStarted()  # only a commit makes it durable
    s.update(0, (1, "a"), 0)  # "a" is after "z": b is descending
    s.update(0, (2, "z"), 4)
    assert s.current(0) == InProgress((2, "z"), 7)
    assert s.snapshot_rows() == 7


@pytest.mark.parametrize("pos", [(1, "z"), (1, "zz"), (0, "a")])
def test_position_must_strictly_grow(pos) -> None:
    s = fresh()
    s.update(0, (1, "z"), 1)
    with pytest.raises(InvalidProgressTransition, match="not after.*positions only grow"):
        s.update(0, pos, 1)
    assert s.current(0) == InProgress((1, "z"), 1)


@pytest.mark.parametrize("rows", [-1, True, 1.5, None])
def test_row_counts_only_grow(rows) -> None:
    s = fresh()
    with pytest.raises(InvalidProgressTransition, match="row count delta .* row counts only grow"):
        s.update(0, (1, "a"), rows)
    with pytest.raises(InvalidProgressTransition, match="non-negative int"):
        s.finish(0, rows)


def test_update_validates_the_key() -> None:
    with pytest.raises(InvalidKeyValue):
        fresh().update(0, (1, None), 1)
    with pytest.raises(InvalidKeyValue):
        fresh().update(0, (1,), 1)


def test_finish_not_started_is_the_empty_placeholder() -> None:
    s = fresh()
    s.finish(0)
    assert s.current(0) == Completed(NULL, 0)
    assert s.is_finished() and s.unfinished_vnodes() == []


def test_finish_not_started_refuses_rows_without_a_position() -> None:
    with pytest.raises(InvalidProgressTransition, match="NotStarted: rows read must come with"):
        fresh().finish(0, 2)


def test_finish_in_progress_keeps_position_and_adds_rows() -> None:
    s = fresh()
    s.update(0, (1, "a"), 3)
    s.finish(0, 2)
    assert s.current(0) == Completed((1, "a"), 5)


def test_nothing_moves_after_completed() -> None:
    s = fresh()
    s.update(0, (1, "a"), 3)
    s.finish(0)
    s.finish(0)  # idempotent, as in the reference
    assert s.current(0) == Completed((1, "a"), 3)
    with pytest.raises(InvalidProgressTransition, match="Completed; its position never moves"):
        s.update(0, (9, "a"), 1)
    with pytest.raises(InvalidProgressTransition, match="already Completed"):
        s.finish(0, 1)


def test_versions_never_go_back() -> None:
    s = fresh()
    s.advance_version(0, 4)
    s.advance_version(0, 4)
    assert s.current_version(0) == 4 and s.version(0) is None
    with pytest.raises(InvalidProgressTransition, match="at version 4, cannot go back to 3"):
        s.advance_version(0, 3)
    for bad in (-1, None, True):
        with pytest.raises(InvalidProgressTransition, match="non-negative int"):
            s.advance_version(0, bad)


def test_commit_plan_inserts_new_rows_then_updates_changed_ones() -> None:
    s = fresh(0, 1, 2)
    s.update(0, (1, "a"), 2)
    s.finish(1)
    for v in (0, 1, 2):
        s.advance_version(v, 7)
    assert s.commit_plan() == [
        ProgressWrite(0, "insert", InProgress((1, "a"), 2), 7),
        ProgressWrite(1, "insert", Completed(NULL, 0), 7),
    ]  # vnode 2 is still NotStarted: no row
    s.mark_committed()
    assert s.committed(0) == InProgress((1, "a"), 2) and s.version(0) == 7
    assert s.committed(2) == NotStarted() and s.version(2) is None
    assert s.commit_plan() == []
    s.update(0, (2, "a"), 1)
    s.advance_version(0, 8)
    assert s.commit_plan() == [ProgressWrite(0, "update", InProgress((2, "a"), 3), 8)]


def test_a_version_change_alone_is_written() -> None:
    s = BackfillState(KO, [0], {0: (Completed((1, "a"), 2), 3)})
    assert s.commit_plan() == []
    s.advance_version(0, 5)
    assert s.commit_plan() == [ProgressWrite(0, "update", Completed((1, "a"), 2), 5)]


def test_commit_plan_needs_a_version() -> None:
    s = fresh()
    s.update(0, (1, "a"), 1)
    with pytest.raises(InvalidProgressTransition, match="no version: call advance_version"):
        s.commit_plan()


def test_recovered_progress_is_committed_and_current() -> None:
    s = BackfillState(
        KO, [0, 1, 2], {0: (InProgress((1, "a"), 2), 4), 1: (Completed(NULL, 0), 5)}
    )
    assert s.current(0) == s.committed(0) == InProgress((1, "a"), 2)
    assert s.version(0) == 4 and s.version(1) == 5 and s.version(2) is None
    assert s.progress_map() == {
        0: InProgress((1, "a"), 2), 1: Completed(NULL, 0), 2: NotStarted()
    }
    assert s.unfinished_vnodes() == [0, 2]


def test_a_copy_is_independent_of_its_original() -> None:
    s = BackfillState(KO, [0, 1, 2], {0: (InProgress((1, "a"), 2), 4)})
    c = s.copy()
    c.update(0, (2, "a"), 3)
    c.advance_version(0, 6)
    c.finish(1)
    c.mark_committed()
    assert s.current(0) == s.committed(0) == InProgress((1, "a"), 2) and s.version(0) == 4
    assert s.current(1) == NotStarted() and s.commit_plan() == []
    assert c.committed(0) == InProgress((2, "a"), 5) and c.version(0) == 6
    assert c.vnodes == s.vnodes and c.key_order == s.key_order


@pytest.mark.parametrize(
    ("progress", "version", "message"),
    [
        (NotStarted(), 3, "NotStarted has no progress row"),
        ("junk", 3, "is not NotStarted, InProgress or Completed"),
        (InProgress((1, "a"), 1), None, "version None is missing"),
        (InProgress((1, "a"), 1), -2, "version -2 is missing or negative"),
        (InProgress((1, "a"), -1), 1, "row_count -1"),
        (Completed(NULL, 3), 1, "empty finished vnode .* must have row_count 0"),
        (InProgress(NULL, 0), 1, "position"),
        (InProgress((1, 2), 0), 1, "position"),
    ],
)
def test_recovery_refuses_corrupt_progress(progress, version, message) -> None:
    with pytest.raises(CorruptProgressRow, match=message) as e:
        BackfillState(KO, [0], {0: (progress, version)})
    assert "vnode 0" in str(e.value) and "drop the MV's state" in str(e.value)


def test_check_progress_normalizes() -> None:
    assert check_progress(KO, 0, Completed((None, None), 0), 1) == (Completed(NULL, 0), 1)
    assert check_progress(KO, 0, Completed(None, 0), 1) == (Completed(NULL, 0), 1)
    assert check_progress(KO, 0, NotStarted(), None) == (NotStarted(), None)


def test_recovery_refuses_vnodes_outside_the_run() -> None:
    with pytest.raises(InvalidVnode, match=r"vnodes \[5\] that are not part of this run"):
        BackfillState(KO, [0], {5: (InProgress((1, "a"), 1), 1)})


@pytest.mark.parametrize("bad", [-1, True, "3", 1.0])
def test_vnodes_must_be_non_negative_ints(bad) -> None:
    with pytest.raises(InvalidVnode, match="must be a non-negative int"):
        check_vnode(bad)
    with pytest.raises(InvalidVnode):
        BackfillState(KO, [bad])


def test_unknown_vnode_is_refused_everywhere() -> None:
    s = fresh(0)
    calls = [
        lambda: s.current(9), lambda: s.committed(9), lambda: s.version(9),
        lambda: s.current_version(9), lambda: s.update(9, (1, "a"), 1),
        lambda: s.finish(9), lambda: s.advance_version(9, 1),
    ]
    for call in calls:
        with pytest.raises(InvalidVnode, match="vnode 9 is not part of this run"):
            call()
