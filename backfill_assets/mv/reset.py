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
from collections.abc import Iterator
from contextlib import contextmanager

from backfill_assets.core.errors import (
    BadPrimaryKeyInUpstream,
    ChangeFeedDisabled,
    HistoryUnavailable,
    InvalidMVDefinition,
    MVResetRefused,
    NoShuffleLayoutMismatch,
    UnsupportedColumnType,
    UnsupportedTableFeature,
    UpstreamNotFound,
    UpstreamSchemaChanged,
)
from backfill_assets.mv import commit_later
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.run_layout import layout_path
from backfill_assets.storage import objects


def mv_state_paths(tables: MVTables) -> list[str]:
    """Every table and file that makes up the MV's state."""
    return [tables.mv, tables.replica, tables.progress, tables.aggregate_state,
            tables.aggregate_input, tables.aggregate_plan, tables.join_state,
            layout_path(tables.root)]


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
    commit_later.settle(tables.progress)  # this process's last progress commit lands first
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


# what a barrier raises when it refuses its input: the user's to fix, and nothing of the MV
# should be left behind. Not a concurrent run (ConcurrentBackfillRun: the other run's tables
# are the MV), a kill, or what the store does wrong (StorageMismatch: kept to be looked at).
INPUT_REFUSALS = (BadPrimaryKeyInUpstream, UnsupportedTableFeature, UnsupportedColumnType,
                  UpstreamSchemaChanged, ChangeFeedDisabled, InvalidMVDefinition,
                  NoShuffleLayoutMismatch, UpstreamNotFound, HistoryUnavailable)
CREATED_VERSIONS = 1  # a platform table is created at version 0 and upgraded at version 1


@contextmanager
def nothing_left_on_refusal(tables: MVTables) -> Iterator[None]:
    """A barrier that refuses its input (INPUT_REFUSALS: an upstream feature the layer cannot
    read, a repeated or null primary key, a definition that does not fit) leaves no trace:
    the MV's state that did not exist before the barrier is deleted again, so the user finds
    what they had, not an empty MV to clean up. Only while it holds nothing but its creation
    (every new table at most at version 1): a table another run has committed rows to since
    is never touched. State that existed before is never touched either, and other errors
    (a concurrent run, a crash, a kill) leave everything for the next barrier's recovery."""
    so = tables.storage_options
    paths = mv_state_paths(tables)
    new = [p for p in paths if not _holds_state(p, so)]
    # the MV's own folder too, when the barrier made it: a refusal leaves no empty folder
    fresh_root = len(new) == len(paths) and not objects.list_names(tables.root, so)
    try:
        yield
    except INPUT_REFUSALS:
        if all(_only_created(p, so) for p in new):
            for path in new:
                objects.delete_prefix(path, so)
            if fresh_root and not objects.list_prefix(tables.root, so):
                objects.delete_prefix(tables.root, so)
        raise


def _only_created(path: str, storage_options) -> bool:
    """No commit after the table's creation (or no table: a folder of documents, nothing)."""
    log = objects.join(path, "_delta_log")
    later = objects.join(log, f"{CREATED_VERSIONS + 1:020d}.json")
    return not objects.exists(later, storage_options)


def _holds_state(path: str, storage_options) -> bool:
    """A table with a log (its first commit, or a checkpoint once log retention cleaned that
    up), or a folder of documents: a few object look-ups, never a listing of a table's files."""
    log = objects.join(path, "_delta_log")
    return (objects.exists(objects.join(log, "00000000000000000000.json"), storage_options)
            or objects.exists(objects.join(log, "_last_checkpoint"), storage_options)
            or bool(objects.list_names(path, storage_options)))
