"""No-shuffle run layout: the vnode sets that share one snapshot position.

A no_shuffle backfill keeps ONE position for all vnodes of a run (as the reference's
NoShuffleBackfill does), so the run's vnode set is part of its state: re-splitting it while the
backfill is in progress would leave vnodes whose position belongs to another group. The sets are
recorded beside the MV's tables; a run over a different, overlapping set is refused until every
vnode of the overlapped sets is finished (then the MV behaves like any other and can be run over
any ranges).

Recorded through the storage layer's object store, where the tables are (a local folder or
S3), as a sequence of documents each written create-only (``storage.append_sequence``): two
runs that read the same layout cannot both record a new one, whichever hosts they run on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from backfill_assets import storage
from backfill_assets.core.errors import RescaleRefused
from backfill_assets.storage import StorageOptions, objects

ATTEMPTS = 16  # another run recording at the same instant: read again and decide again


def layout_path(mv_root: str) -> str:
    """The folder recording the run layout (reset_mv deletes it with the MV's state)."""
    return objects.join(mv_root, "no_shuffle_runs")


def check_run_layout(mv_root: str, vnodes: Sequence[int],
                     unfinished: Callable[[set[int]], set[int]],
                     storage_options: StorageOptions = None) -> None:
    """Refuse a run whose vnode set re-splits an in-progress one; record a new set."""
    mine = set(vnodes)
    folder = layout_path(mv_root)
    for _ in range(ATTEMPTS):
        number, recorded = storage.read_sequence(folder, storage_options)
        groups: list[list[int]] = recorded or []
        if any(set(g) == mine for g in groups):
            return
        overlapped = set().union(*(set(g) for g in groups if set(g) & mine))
        busy = unfinished(overlapped) if overlapped else set()
        if busy:
            raise RescaleRefused(
                f"no_shuffle vnodes {sorted(busy)[:8]}... are in progress as part of run(s) "
                f"{[f'{min(g)}..{max(g)}' for g in groups if set(g) & mine]}; a no_shuffle "
                "backfill shares one position per run, so its vnode ranges cannot change "
                "until it finishes: rerun with the same ranges, or use mode 'arrangement' to "
                "rescale freely"
            )
        kept = [g for g in groups if not set(g) & mine]
        if storage.append_sequence(folder, number + 1, [*kept, sorted(mine)],
                                     storage_options):
            return
    raise RescaleRefused(
        f"the no_shuffle run layout at {folder} changed {ATTEMPTS} times while this run tried "
        "to record its vnodes: other runs are starting over the same MV; rerun this one"
    )
