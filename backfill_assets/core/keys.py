"""Key columns and key order (stub: the core helper completes this module)."""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple  # one Python value per pk column: int, str, datetime.date, datetime.datetime (UTC), decimal.Decimal


@dataclass(frozen=True)
class KeyColumn:
    """One primary-key column: its name, its type ("int", "bigint", "string", "date",
    "timestamp" or "decimal(p,s)") and its order inside the composite key."""

    name: str
    type: str
    descending: bool = False
    nulls_first: bool = False
