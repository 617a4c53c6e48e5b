"""Rebuilding an MV from scratch: drop its state so the next barrier starts fresh.

Why a job and not "delete the folder": the MV's state is several things (the MV table, the
replica, the progress table whose description records the definition's fingerprint, the
no-shuffle run layout) and leaving one behind makes the next barrier recover progress that
no longer matches the MV. This is the documented answer to `MVDefinitionChanged` (and to a
changed vnode count): reset, then run barriers as for a new MV. The upstream is never
touched, and the runtime controls (rate limit, chunk size) are kept: they are the operator's
settings, not state.
"""

from __future__ import annotations

import os
import shutil

from backfill_assets.core.errors import MVResetRefused
from backfill_assets.mv.run_layout import layout_path
from backfill_assets.mv.tables import MVTables


def mv_state_paths(tables: MVTables) -> list[str]:
    """Every table and file that makes up the MV's state."""
    return [tables.mv, tables.replica, tables.progress, layout_path(tables.root)]


def reset_mv(mv_name: str, tables: MVTables, confirm: str) -> list[str]:
    """Delete the MV's state (see module docstring); return what existed and was deleted.
    `confirm` must be the MV's name: a reset cannot be undone."""
    if confirm != mv_name:
        raise MVResetRefused(
            f"reset of MV {mv_name!r} not confirmed (confirm={confirm!r}): a reset deletes the "
            f"MV, its replica and its progress; set confirm to {mv_name!r} to go ahead"
        )
    paths = [_local(p) for p in mv_state_paths(tables)]
    upstream = _local(tables.upstream) if "://" not in tables.upstream.replace("file://", "") \
        else tables.upstream
    if any(upstream == p or upstream.startswith(p.rstrip("/") + "/") for p in paths):
        raise MVResetRefused(
            f"MV {mv_name!r}: its upstream {tables.upstream} lies inside the MV's state; "
            "nothing was deleted: move the upstream or delete the MV's tables by hand"
        )
    deleted = []
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path)
            deleted.append(path)
        elif os.path.exists(path):
            os.remove(path)
            deleted.append(path)
    return deleted


def _local(uri: str) -> str:
    path = uri.removeprefix("file://")
    if "://" in path:
        raise MVResetRefused(
            f"{uri} is in an object store; reset_mv_job deletes local warehouses only: delete "
            "the MV's folder (downstream_mv, replicated_state, backfill_progress, "
            "no_shuffle_runs/) with your object store's tools"
        )
    return path
