"""No-shuffle run layout: the vnode sets that share one snapshot position.

A no_shuffle backfill keeps ONE position for all vnodes of a run (as the reference's
NoShuffleBackfill does), so the run's vnode set is part of its state: re-splitting it while the
backfill is in progress would leave vnodes whose position belongs to another group. The sets are
recorded beside the MV's tables; a run over a different, overlapping set is refused until every
vnode of the overlapped sets is finished (then the MV behaves like any other and can be run over
any ranges).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence

from backfill_assets.errors import RescaleRefused


def layout_path(mv_root: str) -> str:
    """The file recording the run layout (reset_mv deletes it with the MV's state)."""
    return os.path.join(mv_root, "no_shuffle_runs.json")


def check_run_layout(mv_root: str, vnodes: Sequence[int],
                     unfinished: Callable[[set[int]], set[int]]) -> None:
    """Refuse a run whose vnode set re-splits an in-progress one; record a new set."""
    mine = set(vnodes)
    groups = _read(mv_root)
    if any(set(g) == mine for g in groups):
        return
    overlapped = set().union(*(set(g) for g in groups if set(g) & mine))
    busy = unfinished(overlapped) if overlapped else set()
    if busy:
        raise RescaleRefused(
            f"no_shuffle vnodes {sorted(busy)[:8]}... are in progress as part of run(s) "
            f"{[f'{min(g)}..{max(g)}' for g in groups if set(g) & mine]}; a no_shuffle backfill "
            "shares one position per run, so its vnode ranges cannot change until it finishes: "
            "rerun with the same ranges, or use mode 'arrangement' to rescale freely"
        )
    kept = [g for g in groups if not set(g) & mine]
    _write(mv_root, [*kept, sorted(mine)])


def _read(mv_root: str) -> list[list[int]]:
    path = layout_path(mv_root)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write(mv_root: str, groups: list[list[int]]) -> None:
    os.makedirs(mv_root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=mv_root, prefix=".layout-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(groups, f)
    os.replace(tmp, layout_path(mv_root))
