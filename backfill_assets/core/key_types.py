"""Primary-key column types: which types a key column may have and which values fit them.

Why apart from the key order (keys.py): the type rules (spellings Spark and Delta use, decimal
precision, UTC timestamps) are needed wherever a key is declared or checked, while keys.py is
about how keys compare and render as Spark SQL. keys.py re-exports everything here.

A key value is ``int`` (int, bigint), ``str``, ``datetime.date``, ``datetime.datetime`` (UTC;
naive values are taken as UTC) or ``decimal.Decimal`` (decimal(p,s), exactly representable).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation

from backfill_assets.core.errors import InvalidKeyType, InvalidKeyValue

SUPPORTED_TYPES = "int, bigint, string, date, timestamp, decimal(p,s)"
INT_RANGES = {"int": 2**31, "bigint": 2**63}  # a value v fits when -limit <= v < limit
_ALIASES = {"integer": "int", "long": "bigint"}
_SIMPLE = {"int", "bigint", "string", "date", "timestamp"}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


@dataclass(frozen=True)
class KeyColumn:
    """One primary-key column: its name, its type ("int", "bigint", "string", "date",
    "timestamp" or "decimal(p,s)") and its order inside the composite key."""

    name: str
    type: str
    descending: bool = False
    nulls_first: bool = False


def parse_key_type(t: str, column: str | None = None) -> str:
    """Return the canonical spelling of a supported pk type or raise InvalidKeyType.

    Accepts Spark/Delta spellings ("INT", "integer", "long", "decimal(10, 2)"), so a type
    read from an upstream schema can be used as is.
    """
    where = f" of column {column!r}" if column else ""
    text = re.sub(r"\s+", "", t).lower() if isinstance(t, str) else ""
    text = _ALIASES.get(text, text)
    if text in _SIMPLE:
        return text
    match = _DECIMAL.fullmatch(text)
    if match and 1 <= int(match[1]) <= 38 and int(match[2]) <= int(match[1]):
        return f"decimal({int(match[1])},{int(match[2])})"
    if not text:
        raise InvalidKeyType(
            f"primary-key type{where} is unknown ({t!r}): declare it in the MV definition "
            f"or resolve it from the upstream schema; supported: {SUPPORTED_TYPES}"
        )
    raise InvalidKeyType(
        f"unsupported primary-key type {t!r}{where}: use one of {SUPPORTED_TYPES} "
        "(cast the column in the upstream table or choose another primary key)"
    )


def decimal_precision_scale(t: str) -> tuple[int, int]:
    """(p, s) of a "decimal(p,s)" type, in any case and spacing ("DECIMAL(10, 2)"); the one
    parser of decimal types: the vnode hash, the upstream spec and value checks use it."""
    match = _DECIMAL.fullmatch(re.sub(r"\s+", "", t).lower())
    if match is None:
        raise InvalidKeyType(f"{t!r} is not a decimal(p,s) type")
    return int(match[1]), int(match[2])


def to_utc(value: dt.datetime) -> dt.datetime:
    """A timezone-aware UTC datetime; naive values are taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def normalize_value(col: KeyColumn, value: object) -> object:
    """Check one pk value against its column type; timestamps come back in UTC."""
    t = col.type
    ok = False
    if t in INT_RANGES:
        limit = INT_RANGES[t]
        ok = type(value) is int and -limit <= value < limit
    elif t == "string":
        ok = isinstance(value, str)
    elif t == "date":
        ok = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    elif t == "timestamp":
        if isinstance(value, dt.datetime):
            return to_utc(value)
    else:  # decimal(p,s)
        ok = isinstance(value, Decimal) and _decimal_fits(value, *decimal_precision_scale(t))
    if not ok:
        raise InvalidKeyValue(
            f"value {value!r} of pk column {col.name!r} does not fit its type {t}: "
            "fix the data (pk values must be non-null and of the declared type) "
            "or declare the column with its real type"
        )
    return value


def _decimal_fits(value: Decimal, precision: int, scale: int) -> bool:
    # Spark stores decimal(p,s) exactly: a value needing rounding or more digits is not a key
    # Spark could hold, and its vnode text (core/vnode.py) would be rejected too.
    if not value.is_finite():
        return False
    try:
        q = value.quantize(Decimal(1).scaleb(-scale), context=Context(prec=80))
    except InvalidOperation:  # needs more than 80 digits: far beyond decimal(38,s)
        return False
    return q == value and (q.is_zero() or len(q.as_tuple().digits) <= precision)
