"""The stable vnode hash: plain-Python side and the matching Spark SQL expression.

``vnode(key) = crc32(utf8(canonical(key))) mod vnode_count`` where ``canonical(key)`` joins the
canonical text of each primary-key column with the unit separator ``\\x1f`` (see
docs/ARCHITECTURE.md, "Vnode hash"). The canonical text of each type is chosen so that Spark's
own to-string of the column gives the same characters:

============  ===============================================  ================================
type          canonical text                                   Spark expression
============  ===============================================  ================================
int / bigint  decimal digits, ``-`` for negatives              ``CAST(c AS STRING)``
string        the string itself                                ``c``
date          ``YYYY-MM-DD`` (years zero-padded to 4 digits)   ``DATE_FORMAT(c, 'yyyy-MM-dd')``
timestamp     integer microseconds since the epoch (UTC)       ``CAST(UNIX_MICROS(c) AS STRING)``
decimal(p,s)  plain notation, exactly s fraction digits, no -0 ``CAST(c AS STRING)``
============  ===============================================  ================================

This module is pure (standard library only): the core, the adapters and the tests share it.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import re
import zlib
from collections.abc import Sequence

from backfill_assets.core.errors import InvalidKeyType, InvalidKeyValue
from backfill_assets.core.key_types import decimal_precision_scale

DEFAULT_VNODE_COUNT = 256
MAX_VNODE_COUNT = 32768
SEPARATOR = "\x1f"
KEY_TYPES = ("int", "bigint", "string", "date", "timestamp", "decimal(p,s)")

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_ONE_MICRO = _dt.timedelta(microseconds=1)
_DECIMAL_RE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key_type_error(message: str) -> Exception:
    return InvalidKeyType(message)


def _key_value_error(message: str) -> Exception:
    return InvalidKeyValue(message)


def normalize_key_type(type_name: str) -> str:
    """The canonical spelling of a key type ("DECIMAL(10, 2)" -> "decimal(10,2)")."""
    t = type_name.strip().lower()
    if t in ("int", "bigint", "string", "date", "timestamp"):
        return t
    m = _DECIMAL_RE.match(t)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        if not (1 <= p <= 38 and 0 <= s <= p):
            raise _key_type_error(
                f"key type {type_name!r}: decimal precision must be 1..38 and scale 0..precision"
            )
        return f"decimal({p},{s})"
    raise _key_type_error(
        f"key type {type_name!r} is not supported for a primary key; use one of "
        "int, bigint, string, date, timestamp or decimal(p,s)"
    )


def timestamp_micros(value: _dt.datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return (value - _EPOCH) // _ONE_MICRO


def canonical_value_text(value: object, type_name: str) -> str:
    """The canonical text of one key column value (see the module docstring)."""
    t = normalize_key_type(type_name)
    if value is None:
        raise _key_value_error(f"a primary-key value of type {t} is null; keys must be non-null")
    if t in _INT_RANGE:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _key_value_error(f"{value!r} is not an integer (key type {t})")
        lo, hi = _INT_RANGE[t]
        if not lo <= value <= hi:
            raise _key_value_error(f"{value} is out of range for key type {t}")
        return str(value)
    if t == "string":
        if not isinstance(value, str):
            raise _key_value_error(f"{value!r} is not a string (key type string)")
        return value
    if t == "date":
        if isinstance(value, _dt.datetime) or not isinstance(value, _dt.date):
            raise _key_value_error(f"{value!r} is not a datetime.date (key type date)")
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    if t == "timestamp":
        if not isinstance(value, _dt.datetime):
            raise _key_value_error(f"{value!r} is not a datetime.datetime (key type timestamp)")
        return str(timestamp_micros(value))
    # decimal(p,s)
    precision, scale = decimal_precision_scale(t)
    return decimal_text(value, precision, scale)


def decimal_text(value: object, precision: int, scale: int) -> str:
    """Plain notation with exactly ``scale`` fraction digits; rejects values that would need
    rounding or more than ``precision`` digits (Spark would store them differently)."""
    if isinstance(value, bool) or not isinstance(value, (int, _decimal.Decimal)):
        raise _key_value_error(f"{value!r} is not a decimal.Decimal (key type decimal)")
    d = _decimal.Decimal(value)
    if not d.is_finite():
        raise _key_value_error(f"{value!r} is not a finite decimal")
    ctx = _decimal.Context(prec=80)
    q = d.quantize(_decimal.Decimal(1).scaleb(-scale), context=ctx)
    if q != d:
        raise _key_value_error(f"{value!r} has more than {scale} fraction digits")
    if len(q.as_tuple().digits) > precision and q != 0:
        raise _key_value_error(f"{value!r} does not fit decimal({precision},{scale})")
    if q.is_zero():
        q = abs(q)  # no negative zero: Spark prints 0.00
    return format(q, "f")


def text_function(type_name: str):
    """A function value -> canonical text for one column type (the type parsed once; each value
    still checked). Used by the vectorised helpers that hash many keys."""
    t = normalize_key_type(type_name)
    if t in _INT_RANGE:
        lo, hi = _INT_RANGE[t]

        def int_text(value: object) -> str:
            if type(value) is int and lo <= value <= hi:  # noqa: E721 (bool is not a key int)
                return str(value)
            return canonical_value_text(value, t)

        return int_text
    if t == "string":
        return lambda value: value if type(value) is str else canonical_value_text(value, t)
    return lambda value: canonical_value_text(value, t)


def vnodes_of(keys: Sequence[tuple], types: Sequence[str], vnode_count: int) -> list[int]:
    """vnode_of for many keys (same result, fewer per-key checks)."""
    check_vnode_count(vnode_count)
    fns = [text_function(t) for t in types]
    crc = zlib.crc32
    if len(fns) == 1:
        f = fns[0]
        return [crc(f(k[0]).encode("utf-8")) % vnode_count for k in keys]
    out = []
    for k in keys:
        if len(k) != len(fns):
            raise _key_value_error(f"key {k!r} has {len(k)} values, the key has {len(fns)} columns")
        text = SEPARATOR.join(f(v) for f, v in zip(fns, k, strict=True))
        out.append(crc(text.encode("utf-8")) % vnode_count)
    return out


def canonical_key_text(key: tuple, types: Sequence[str]) -> str:
    """The canonical text of a whole key: each column's text joined with ``\\x1f``."""
    key = tuple(key)
    if len(key) != len(types):
        raise _key_value_error(
            f"key {key!r} has {len(key)} values, the key has {len(types)} columns"
        )
    return SEPARATOR.join(canonical_value_text(v, t) for v, t in zip(key, types, strict=True))


def check_vnode_count(vnode_count: int) -> int:
    if isinstance(vnode_count, bool) or not isinstance(vnode_count, int):
        raise ValueError(f"vnode count must be an integer, got {vnode_count!r}")
    if not 1 <= vnode_count <= MAX_VNODE_COUNT:
        raise ValueError(f"vnode count must be in 1..{MAX_VNODE_COUNT}, got {vnode_count}")
    return vnode_count


def vnode_of(key: tuple, types: Sequence[str], vnode_count: int = DEFAULT_VNODE_COUNT) -> int:
    """The vnode of a key: crc32 of the UTF-8 canonical text, modulo the vnode count."""
    check_vnode_count(vnode_count)
    return zlib.crc32(canonical_key_text(key, types).encode("utf-8")) % vnode_count


def _quote_ident(name: str) -> str:
    return name if _IDENT_RE.match(name) else "`" + name.replace("`", "``") + "`"


def spark_key_text_sql(name: str, type_name: str) -> str:
    """Spark SQL for the canonical text of one key column."""
    t = normalize_key_type(type_name)
    c = _quote_ident(name)
    if t in ("int", "bigint") or t.startswith("decimal("):
        return f"CAST({c} AS STRING)"
    if t == "string":
        return c
    if t == "date":
        return f"DATE_FORMAT({c}, 'yyyy-MM-dd')"
    return f"CAST(UNIX_MICROS({c}) AS STRING)"  # timestamp


def spark_vnode_sql(
    names: Sequence[str], types: Sequence[str], vnode_count: int = DEFAULT_VNODE_COUNT
) -> str:
    """Spark SQL computing the same vnode as :func:`vnode_of` (an INT expression)."""
    check_vnode_count(vnode_count)
    if len(names) != len(types) or not names:
        raise _key_type_error("a key needs one type per column and at least one column")
    parts = ", ".join(spark_key_text_sql(n, t) for n, t in zip(names, types, strict=True))
    return f"CAST(PMOD(CRC32(CAST(CONCAT_WS(CHAR(31), {parts}) AS BINARY)), {vnode_count}) AS INT)"
