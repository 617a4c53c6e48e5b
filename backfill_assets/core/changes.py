"""Upstream changes: netting, update normalization and visibility against per-vnode progress.

Why netting: a step applies the change data feed of (v_prev, v_new] as one merge into the
MV, which needs at most one change per key: the last one. Why visibility: the MV holds, per
vnode, exactly the upstream rows at or before the vnode's position (all once Completed), so a
change to a key after the position must be dropped; the snapshot will bring the row later
(the reference's ``mark_chunk_ref_by_vnode``). Why update normalization: an update whose
halves have different keys (or land on different sides of a position) is not an in-place
update downstream; it is a delete of one key and an insert of another
(``normalize_unmatched_updates``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from backfill_assets.core.errors import InvalidVnode
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.progress import Completed, InProgress, VnodeProgress, is_count

ChangeType = Literal["insert", "delete", "update_preimage", "update_postimage"]
CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")
_UPSERTS = ("insert", "update_postimage")
STREAM_OPS = ("+", "-", "U-", "U+")

VnodeOf = Callable[[Key], int]


@dataclass(frozen=True)
class RawChange:
    """One change data feed row: its commit version, change type, pk and full row."""

    version: int
    change_type: ChangeType
    key: Key
    row: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if self.change_type not in CHANGE_TYPES:
            raise ValueError(f"change type {self.change_type!r} is not one of {CHANGE_TYPES}")
        if not is_count(self.version):
            raise ValueError(f"change version {self.version!r} must be a non-negative int")


@dataclass(frozen=True)
class NetChange:
    """The last change of a key in a version range: upsert its row, or delete the key."""

    key: Key
    op: Literal["upsert", "delete"]
    row: Mapping[str, object] | None
    version: int


@dataclass(frozen=True)
class StreamOp:
    """A change in the reference's stream form: insert, delete, or an update half."""

    op: Literal["+", "-", "U-", "U+"]
    key: Key
    row: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if self.op not in STREAM_OPS:
            raise ValueError(f"stream op {self.op!r} is not one of {STREAM_OPS}")


def select_changes(
    raw: Iterable[RawChange], vnode_of: VnodeOf, since: Mapping[int, int | None], v_new: int
) -> list[RawChange]:
    """The changes a step forwards: per vnode, versions in (since[vnode], v_new].

    Vnodes may be at different versions, so one change feed read from the lowest version is
    cut per vnode here. Changes of vnodes absent from ``since`` (other runs) and of vnodes
    whose ``since`` is None (NotStarted: nothing to forward) are dropped.
    """
    out = []
    for c in raw:
        start = since.get(vnode_of(c.key))
        if start is not None and start < c.version <= v_new:
            out.append(c)
    return out


def net_changes(raw: Iterable[RawChange], key_order: KeyOrder) -> list[NetChange]:
    """One change per key, in key order: the last one wins.

    A higher version wins; within one version an insert/postimage beats a delete/preimage of
    the same key (one Delta commit touches a key once, so when both appear the key exists
    afterwards, e.g. two rows swapping keys). A preimage nets to a delete and a postimage to
    an upsert, so a pk-changing update becomes delete(old key) + upsert(new key).
    """
    best: dict[Key, tuple[tuple[int, int, int], RawChange]] = {}
    for i, c in enumerate(raw):
        key = key_order.normalize(c.key)
        rank = (c.version, c.change_type in _UPSERTS, i)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, c)
    nets = [
        NetChange(k, "upsert" if c.change_type in _UPSERTS else "delete", c.row, c.version)
        for k, (_, c) in best.items()
    ]
    return sorted(nets, key=lambda n: key_order.sort_key(n.key))


def is_visible(
    key: Key, vnode_of: VnodeOf, progress: Mapping[int, VnodeProgress], key_order: KeyOrder
) -> bool:
    """A change reaches the MV iff its vnode is Completed, or InProgress with key <= position."""
    vnode = vnode_of(key)
    p = progress.get(vnode)
    if p is None:
        raise InvalidVnode(
            f"a change to key {key!r} belongs to vnode {vnode}, which is not in this step: "
            "read changes only for the step's vnodes (filter the change feed by vnode)"
        )
    if isinstance(p, Completed):
        return True
    if isinstance(p, InProgress):
        return key_order.compare(key, p.current_pos) <= 0
    return False


def visible(
    net: Iterable[NetChange],
    vnode_of: VnodeOf,
    progress: Mapping[int, VnodeProgress],
    key_order: KeyOrder,
) -> list[NetChange]:
    """The netted changes that reach the MV (see ``is_visible``)."""
    return [n for n in net if is_visible(n.key, vnode_of, progress, key_order)]


def normalize_updates(
    ops: Sequence[StreamOp],
    key_order: KeyOrder,
    visible_key: Callable[[Key], bool] | None = None,
) -> list[StreamOp]:
    """Rewrite U-/U+ into -/+ when a pair's keys differ or, given ``visible_key``, its halves
    fall on different sides of the position; a lone U- or U+ becomes - or +.

    Downstream, a U-/U+ pair means "this row changed in place"; after a pk change or after
    visibility dropped one half, that is false and the halves must stand on their own.
    """
    out: list[StreamOp] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if op.op == "U-" and nxt is not None and nxt.op == "U+":
            split = key_order.compare(op.key, nxt.key) != 0 or (
                visible_key is not None and visible_key(op.key) != visible_key(nxt.key)
            )
            if split:
                out += [dataclasses.replace(op, op="-"), dataclasses.replace(nxt, op="+")]
            else:
                out += [op, nxt]
            i += 2
            continue
        lone = {"U-": "-", "U+": "+"}.get(op.op)
        out.append(dataclasses.replace(op, op=lone) if lone else op)  # type: ignore[arg-type]
        i += 1
    return out


def mark_visible(
    ops: Sequence[StreamOp],
    vnode_of: VnodeOf,
    progress: Mapping[int, VnodeProgress],
    key_order: KeyOrder,
) -> list[StreamOp]:
    """The stream ops that reach the MV, straddling update pairs split into -/+ first (the
    ``mark_chunk_ref_by_vnode`` analogue). Every U- left is directly followed by its U+."""

    def seen(key: Key) -> bool:
        return is_visible(key, vnode_of, progress, key_order)

    return [o for o in normalize_updates(ops, key_order, seen) if seen(o.key)]
