"""Key order, snapshot bounds and the Spark SQL text for position predicates.

Why one object owns all of it: the Python comparison (visibility, netting, positions) and
the SQL the adapters push into Spark (snapshot bounds, ORDER BY) must agree on the order of
every composite key, column direction and null placement included; rendering both from one
``KeyOrder`` makes a disagreement impossible.

A key is a tuple with one Python value per pk column: ``int``, ``str``, ``datetime.date``,
``datetime.datetime`` (UTC; naive values are taken as UTC) or ``decimal.Decimal``. ``None``
appears only in the all-null placeholder that marks a vnode whose snapshot was empty. The key
columns, their types and the values that fit them are in key_types.py, re-exported here.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from backfill_assets.core.errors import InvalidKeyValue, InvalidMVDefinition
from backfill_assets.core.key_types import (
    INT_RANGES,
    SUPPORTED_TYPES,
    KeyColumn,
    decimal_precision_scale,
    normalize_value,
    parse_key_type,
    to_utc,
)

__all__ = ["SUPPORTED_TYPES", "Bound", "Key", "KeyColumn", "KeyOrder", "compute_bounds",
           "decimal_precision_scale", "normalize_value", "parse_key_type", "to_utc"]

Key = tuple  # one value per pk column (see the module docstring)


@dataclass(frozen=True)
class Bound:
    """Where a snapshot read starts: ``lower`` None = from the first key, otherwise strictly
    after ``lower``; ``empty`` = nothing to read (the finished all-null placeholder)."""

    lower: Key | None
    empty: bool = False

    def admits(self, order: KeyOrder, key: Key) -> bool:
        """True when a snapshot read with this bound returns ``key``."""
        if self.empty:
            return False
        return self.lower is None or order.compare(key, self.lower) > 0

    def predicate(self, order: KeyOrder, qualifier: str | None = None) -> str:
        """The Spark SQL filter for this bound."""
        if self.empty:
            return "FALSE"
        return order.sql_after(self.lower, qualifier)


def compute_bounds(pos: Key | None) -> Bound:
    """Snapshot bound for a position, as in the reference: no position scans from the start,
    a position scans strictly after it, the all-null placeholder reads nothing."""
    if pos is None:
        return Bound(None)
    if all(v is None for v in pos):
        return Bound(tuple(pos), empty=True)
    return Bound(tuple(pos))


@dataclass(frozen=True)
class KeyOrder:
    """Lexicographic order of composite keys with a direction and null placement per column."""

    columns: tuple[KeyColumn, ...]

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        if not cols:
            raise InvalidMVDefinition(
                "the primary key has no column: declare primary_key in the MV definition"
            )
        checked = []
        for c in cols:
            checked.append(
                KeyColumn(c.name, parse_key_type(c.type, c.name), bool(c.descending),
                          bool(c.nulls_first))
            )
        names = [c.name for c in checked]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidMVDefinition(
                f"primary key lists {dupes} more than once: name each pk column once"
            )
        object.__setattr__(self, "columns", tuple(checked))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> KeyColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise InvalidKeyValue(f"{name!r} is not a pk column; pk columns are {list(self.names)}")

    def placeholder(self) -> Key:
        """The all-null position of a vnode whose snapshot was empty."""
        return (None,) * len(self.columns)

    def is_placeholder(self, pos: Key | None) -> bool:
        return pos is not None and len(pos) == len(self.columns) and all(
            v is None for v in pos
        )

    def _check_arity(self, key: object) -> tuple:
        if not isinstance(key, tuple) or len(key) != len(self.columns):
            raise InvalidKeyValue(
                f"key {key!r} must be a tuple of {len(self.columns)} values, one per pk "
                f"column {list(self.names)}"
            )
        return key

    def normalize(self, key: Key) -> Key:
        """Validate a non-null key and return it with timestamps in UTC (hashable, comparable)."""
        self._check_arity(key)
        return tuple(normalize_value(c, v) for c, v in zip(self.columns, key, strict=True))

    def compare(self, a: Key, b: Key) -> int:
        """-1, 0 or 1 as ``a`` sorts before, with or after ``b`` in this order."""
        self._check_arity(a)
        self._check_arity(b)
        for col, x, y in zip(self.columns, a, b, strict=True):
            c = _compare_values(col, x, y)
            if c:
                return c
        return 0

    @property
    def sort_key(self) -> Callable[[Key], object]:
        """A ``key=`` function for ``sorted``/``max`` that follows this order."""
        return functools.cmp_to_key(self.compare)

    def max_key(self, keys: Iterable[Key]) -> Key:
        """The last key in this order (ValueError when ``keys`` is empty, like ``max``)."""
        return max(keys, key=self.sort_key)

    def _ref(self, col: KeyColumn, qualifier: str | None) -> str:
        name = "`" + col.name.replace("`", "``") + "`"
        return f"{qualifier}.{name}" if qualifier else name

    def sql_literal(self, column: KeyColumn | str, value: object) -> str:
        """A Spark SQL literal for a pk value.

        Strings: quotes doubled, backslashes escaped (Spark's lexer reads both inside a
        literal while spark.sql.parser.escapedStringLiterals is false, the default).
        Timestamps: UTC wall-clock text, so sessions must run with session.timeZone=UTC.
        Decimals: a CAST of the plain text, so no float rounding is involved.
        """
        col = self.column(column if isinstance(column, str) else column.name)
        if value is None:
            return "NULL"
        value = normalize_value(col, value)
        if col.type in INT_RANGES:
            return str(value)
        if col.type == "string":
            text = str(value).replace("\\", "\\\\").replace("'", "''")
            return f"'{text}'"
        if col.type == "date":
            return f"DATE '{_iso_date(value)}'"
        if col.type == "timestamp":
            return f"TIMESTAMP '{_iso_date(value)} {value:%H:%M:%S.%f}'"
        p, s = decimal_precision_scale(col.type)
        return f"CAST('{value:f}' AS DECIMAL({p},{s}))"

    def sql_after(self, pos: Key | None, qualifier: str | None = None) -> str:
        """Predicate: the row key sorts strictly after ``pos``.

        ``None`` (no position yet) is "TRUE": everything is after it. The all-null placeholder
        is "FALSE": it marks a finished vnode, which has nothing left to read.
        """
        if pos is None:
            return "TRUE"
        if self.is_placeholder(pos):
            return "FALSE"
        return self._lexicographic(pos, qualifier, inclusive=False, after=True)

    def sql_at_or_before(self, pos: Key | None, qualifier: str | None = None) -> str:
        """Predicate: the row key sorts at or before ``pos`` (visible at this position).

        ``None`` (NotStarted) is "FALSE": nothing is visible. The all-null placeholder is
        "TRUE": it only occurs for a Completed vnode, where everything is visible.
        """
        if pos is None:
            return "FALSE"
        if self.is_placeholder(pos):
            return "TRUE"
        return self._lexicographic(pos, qualifier, inclusive=True, after=False)

    def sql_after_columns(self, prefix: str) -> str:
        """Predicate: the row key sorts strictly after the key held in the columns
        ``prefix + name`` (a position joined onto each row). One short expression serves every
        vnode, where a literal predicate per vnode would be an OR of hundreds of terms that
        Spark can only interpret row by row."""
        return self._compare(self._prefixed(prefix), None, inclusive=False, after=True)

    def sql_at_or_before_columns(self, prefix: str) -> str:
        """Predicate: the row key sorts at or before the key in the columns ``prefix + name``."""
        return self._compare(self._prefixed(prefix), None, inclusive=True, after=False)

    def position_columns(self, prefix: str) -> list[str]:
        """The names of the columns that hold a joined position (see ``sql_after_columns``)."""
        return [prefix + c.name for c in self.columns]

    def _prefixed(self, prefix: str) -> list[str]:
        return ["`" + n.replace("`", "``") + "`" for n in self.position_columns(prefix)]

    def _lexicographic(
        self, pos: Key, qualifier: str | None, inclusive: bool, after: bool
    ) -> str:
        pos = self.normalize(pos)
        values = [self.sql_literal(c, v) for c, v in zip(self.columns, pos, strict=True)]
        return self._compare(values, qualifier, inclusive, after)

    def _compare(self, others: Sequence[str], qualifier: str | None, inclusive: bool,
                 after: bool) -> str:
        """Lexicographic comparison of the row key with ``others`` (SQL literals or columns)."""
        expr = ""
        for col, other in reversed(list(zip(self.columns, others, strict=True))):
            ref = self._ref(col, qualifier)
            op = ">" if after != col.descending else "<"
            if not expr:
                expr = f"{ref} {op}{'=' if inclusive else ''} {other}"
            else:
                expr = f"{ref} {op} {other} OR ({ref} = {other} AND {expr})"
            expr = f"({expr})"
        return expr

    def order_by_sql(self, qualifier: str | None = None) -> list[str]:
        """ORDER BY items that sort rows in this order, e.g. "`a` ASC NULLS LAST"."""
        return [
            f"{self._ref(c, qualifier)} {'DESC' if c.descending else 'ASC'} "
            f"NULLS {'FIRST' if c.nulls_first else 'LAST'}"
            for c in self.columns
        ]


def _iso_date(value: dt.date) -> str:
    # date.isoformat() already pads the year to 4 digits; spelled out for clarity
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def _compare_values(col: KeyColumn, x: object, y: object) -> int:
    if x is None or y is None:
        if x is None and y is None:
            return 0
        null_side = -1 if col.nulls_first else 1
        return null_side if x is None else -null_side
    if col.type == "timestamp" and isinstance(x, dt.datetime) and isinstance(y, dt.datetime):
        x, y = to_utc(x), to_utc(y)
    try:
        c = (x > y) - (x < y)  # type: ignore[operator]
    except TypeError as e:
        raise InvalidKeyValue(
            f"cannot compare {x!r} with {y!r} in pk column {col.name!r} ({col.type}): "
            "keys must hold values of the column's type"
        ) from e
    return -c if col.descending else c
