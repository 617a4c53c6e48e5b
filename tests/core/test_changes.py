"""Change netting, per-vnode version ranges, visibility and update normalization."""

from __future__ import annotations

import pytest

from backfill_assets.core.changes import (
    NetChange,
    RawChange,
    StreamOp,
    is_visible,
    mark_visible,
    net_changes,
    normalize_updates,
    select_changes,
    visible,
)
from backfill_assets.core.errors import InvalidVnode
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.progress import Completed, InProgress, NotStarted

KO = KeyOrder((KeyColumn("k", "int", descending=True),))


def vnode_of(key: tuple) -> int:
    return key[0] % 3


def r(k: int, v: int = 0) -> dict:
    return {"k": k, "v": v}


def test_raw_change_and_stream_op_validate_their_kind() -> None:
    with pytest.raises(ValueError, match="change type 'merge'"):
        RawChange(1, "merge", (1,), None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version -1"):
        RawChange(-1, "insert", (1,), None)
    with pytest.raises(ValueError, match="stream op 'U'"):
        StreamOp("U", (1,))  # type: ignore[arg-type]


def test_last_change_of_a_key_wins_in_key_order() -> None:
    raw = [
        RawChange(2, "insert", (1,), r(1, 1)),
        RawChange(3, "update_preimage", (1,), r(1, 1)),
        RawChange(3, "update_postimage", (1,), r(1, 2)),
        RawChange(2, "insert", (5,), r(5)),
        RawChange(4, "delete", (5,), r(5)),
    ]
    assert net_changes(raw, KO) == [  # descending key order: 5 before 1
        NetChange((5,), "delete", r(5), 4),
        NetChange((1,), "upsert", r(1, 2), 3),
    ]


def test_higher_version_wins_whatever_the_input_order() -> None:
    raw = [RawChange(5, "delete", (1,), r(1)), RawChange(4, "insert", (1,), r(1))]
    assert net_changes(raw, KO) == [NetChange((1,), "delete", r(1), 5)]


@pytest.mark.parametrize("order", [0, 1])
def test_within_a_version_insert_or_postimage_beats_delete_or_preimage(order) -> None:
    pairs = [
        [RawChange(3, "delete", (1,), r(1)), RawChange(3, "insert", (1,), r(1, 9))],
        [RawChange(3, "update_postimage", (1,), r(1, 9)),
         RawChange(3, "update_preimage", (1,), r(1))],
    ]
    for pair in pairs:
        raw = pair if order == 0 else pair[::-1]
        assert net_changes(raw, KO) == [NetChange((1,), "upsert", r(1, 9), 3)]


def test_same_rank_ties_go_to_the_later_row() -> None:
    raw = [RawChange(3, "insert", (1,), r(1, 1)), RawChange(3, "insert", (1,), r(1, 2))]
    assert net_changes(raw, KO)[0].row == r(1, 2)


def test_pk_changing_update_becomes_delete_plus_upsert() -> None:
    raw = [RawChange(2, "update_preimage", (1,), r(1)),
           RawChange(2, "update_postimage", (4,), r(4))]
    assert net_changes(raw, KO) == [
        NetChange((4,), "upsert", r(4), 2), NetChange((1,), "delete", r(1), 2)
    ]


def test_keys_are_netted_after_normalization() -> None:
    import datetime as dt

    ko = KeyOrder((KeyColumn("t", "timestamp"),))
    naive, aware = dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    raw = [RawChange(1, "insert", (naive,), {}), RawChange(2, "delete", (aware,), {})]
    assert [n.op for n in net_changes(raw, ko)] == ["delete"]


def test_select_changes_cuts_each_vnode_at_its_own_version() -> None:
    raw = [RawChange(v, "insert", (k,), r(k)) for v in (1, 2, 3, 4) for k in (0, 1, 2)]
    got = select_changes(raw, vnode_of, {0: 1, 1: 3, 2: None}, 3)
    assert [(c.version, c.key) for c in got] == [(2, (0,)), (3, (0,))]
    assert select_changes(raw, vnode_of, {}, 4) == []


PROGRESS = {0: NotStarted(), 1: InProgress((7,), 2), 2: Completed((5,), 1)}


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ((3,), False),  # NotStarted: nothing
        ((6,), False),  # vnode 0
        ((10,), True),  # InProgress, descending: 10 sorts before 7
        ((7,), True),  # at the position
        ((4,), False),  # after the position
        ((1,), False),
        ((8,), True),  # Completed: everything
        ((2,), True),
    ],
)
def test_is_visible(key, expected) -> None:
    assert is_visible(key, vnode_of, PROGRESS, KO) is expected


def test_visible_filters_net_changes() -> None:
    net = [NetChange((k,), "upsert", r(k), 1) for k in (13, 10, 7, 4, 3, 2)]
    assert [n.key for n in visible(net, vnode_of, PROGRESS, KO)] == [(13,), (10,), (7,), (2,)]


def test_a_change_outside_the_step_is_refused() -> None:
    with pytest.raises(InvalidVnode, match="vnode 2, which is not in this step.*filter the"):
        is_visible((5,), vnode_of, {0: NotStarted()}, KO)


def ops(*spec: tuple[str, int]) -> list[StreamOp]:
    return [StreamOp(op, (k,)) for op, k in spec]


def test_normalize_keeps_same_key_pairs_and_splits_pk_changes() -> None:
    got = normalize_updates(ops(("U-", 1), ("U+", 1), ("U-", 1), ("U+", 2), ("+", 3)), KO)
    assert got == ops(("U-", 1), ("U+", 1), ("-", 1), ("+", 2), ("+", 3))


def test_normalize_rewrites_lone_halves() -> None:
    assert normalize_updates(ops(("U+", 1), ("U-", 2)), KO) == ops(("+", 1), ("-", 2))
    assert normalize_updates(ops(("U-", 2), ("-", 1)), KO) == ops(("-", 2), ("-", 1))


def test_normalize_splits_pairs_straddling_the_position() -> None:
    seen = iter([True, False])  # a visibility that differs between the halves
    got = normalize_updates(ops(("U-", 1), ("U+", 1)), KO, lambda _k: next(seen))
    assert got == ops(("-", 1), ("+", 1))
    assert normalize_updates(ops(("U-", 1), ("U+", 1)), KO, lambda _k: True) == ops(
        ("U-", 1), ("U+", 1)
    )


def test_mark_visible_splits_straddling_pk_changes_and_drops_the_invisible_half() -> None:
    # 10 -> 4 in vnode 1: 10 is visible, 4 is after the position
    got = mark_visible(ops(("U-", 10), ("U+", 4), ("U-", 7), ("U+", 7), ("+", 3)),
                       vnode_of, PROGRESS, KO)
    assert got == ops(("-", 10), ("U-", 7), ("U+", 7))


def test_mark_visible_keeps_pairs_within_the_visible_range() -> None:
    got = mark_visible(ops(("U-", 13), ("U+", 10)), vnode_of, PROGRESS, KO)
    assert got == ops(("-", 13), ("+", 10))  # keys differ: delete + insert
