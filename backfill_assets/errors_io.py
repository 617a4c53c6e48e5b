"""Errors of the storage/Spark adapters and settings.

The classes live at the end of backfill_assets/core/errors.py (one place for every named error);
this module re-exports them for code that imports them from here.
"""

from __future__ import annotations

from backfill_assets.core.errors import (
    ChangeFeedDisabled,
    DuplicatePrimaryKey,
    HistoryUnavailable,
    InvalidDmlBatch,
    InvalidSettings,
    InvalidUpstreamSpec,
    InvalidVersionRange,
    MissingPrimaryKey,
    NotAnUpstreamTable,
    NullPrimaryKey,
    TableNotFound,
    UnknownColumn,
    UnsupportedTableFeature,
    WrongColumnType,
)

__all__ = [
    "ChangeFeedDisabled",
    "DuplicatePrimaryKey",
    "HistoryUnavailable",
    "InvalidDmlBatch",
    "InvalidSettings",
    "InvalidUpstreamSpec",
    "InvalidVersionRange",
    "MissingPrimaryKey",
    "NotAnUpstreamTable",
    "NullPrimaryKey",
    "TableNotFound",
    "UnknownColumn",
    "UnsupportedTableFeature",
    "WrongColumnType",
]
