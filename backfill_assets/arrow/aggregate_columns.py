"""The hidden column names of an aggregate's state, kept input and signed changes (one
place, so the state update and the kept input's update name them alike)."""

from __future__ import annotations

from backfill_assets.core.names import INTERNAL_PREFIX

SIGN = f"{INTERNAL_PREFIX}sign"
ROWS = f"{INTERNAL_PREFIX}rows"
OLD_ROWS = f"{INTERNAL_PREFIX}old_rows"  # a group's row count before the batch
TOUCHED = f"{INTERNAL_PREFIX}touched"  # whether a change row entered the group
AT = f"{INTERNAL_PREFIX}at"  # an old state row's position


def count_column(i: int) -> str:
    return f"{INTERNAL_PREFIX}count_{i}"


def sum_column(i: int) -> str:
    return f"{INTERNAL_PREFIX}sum_{i}"


def value_column(i: int) -> str:
    return f"{INTERNAL_PREFIX}value_{i}"
