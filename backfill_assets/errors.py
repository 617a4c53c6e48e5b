"""Errors of the backfill step, plus every other named error re-exported for callers.

Callers import errors from here: one place to look up what a user can run into.
"""

from __future__ import annotations

from backfill_assets.core.errors import *  # noqa: F403
from backfill_assets.core.errors import BackfillError


class ConcurrentBackfillRun(BackfillError):
    """Another run wrote the same vnodes at the same time; this one wrote nothing more."""


class FollowerAlreadyRunning(BackfillError):
    """A follower run already follows some of these vnodes; two would only fence each other."""


class WarehouseNotWritable(BackfillError):
    """The warehouse folder cannot be written by this user."""


class UpstreamNotFound(BackfillError):
    """The MV's upstream table does not exist."""


class UpstreamSchemaChanged(BackfillError):
    """A column the backfill uses was dropped or changed type in the upstream."""


class UnsupportedColumnType(BackfillError):
    """An upstream column has a type the platform cannot carry."""


class VnodeCountChanged(BackfillError):
    """The MV's vnode count differs from the state already on disk."""


class NoShuffleLayoutMismatch(BackfillError):
    """no_shuffle mode on an upstream that is not arranged by the same vnodes."""


class RescaleRefused(BackfillError):
    """An in-progress no_shuffle backfill was asked to run over different vnode ranges."""


class BadPrimaryKeyInUpstream(BackfillError):
    """The upstream holds a null or duplicate primary key."""


class StorageMismatch(BackfillError):
    """What the store holds is not what the Delta log (or the writer) says it should hold:
    files an executor wrote that the driver cannot see, a read that returned a different row
    count than the log records, a log the storage layer cannot replay. Never committed over."""


class MVDefinitionChanged(BackfillError):
    """The MV definition differs from the one its state was built for (filter, computed
    columns, output columns, pk, mode or upstream): the MV is no longer f(upstream)."""


class MVResetRefused(BackfillError):
    """reset_mv_job was not confirmed with the MV's name, or cannot delete the MV's tables."""
