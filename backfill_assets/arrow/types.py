"""Column type names of the platform <-> Arrow types.

The pure core speaks in type names ("bigint", "decimal(10,2)"); Delta and Spark speak Arrow.
This is the one translation between them, so a type accepted in one place is accepted in all.
It is exact both ways (`type_name(arrow_type(n)) == n`): a smallint stays a smallint and a
timestamp without time zone (Delta `timestamp_ntz`) never becomes a UTC timestamp, so the MV,
the replica and the progress table hold the upstream's types, not look-alikes. `null` is the
type of a column that can only hold nulls (Arrow `null`, Delta/Spark `void`).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from backfill_assets.core.errors import InvalidKeyType

_SIMPLE: dict[str, pa.DataType] = {
    "tinyint": pa.int8(),
    "smallint": pa.int16(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "null": pa.null(),
}
SUPPORTED = ", ".join([*_SIMPLE, "decimal(p,s)"])
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type stored for a platform type name."""
    if name in _SIMPLE:
        return _SIMPLE[name]
    match = _DECIMAL.match(name)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise InvalidKeyType(f"column type {name!r} is not supported; use one of {SUPPORTED}")


def type_name(t: pa.DataType) -> str:
    """The platform type name of an Arrow type (the exact inverse of arrow_type; string and
    binary views and large variants are the same Delta type)."""
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):  # Delta: microseconds, UTC-adjusted or without time zone
        return "timestamp_ntz" if t.tz is None else "timestamp"
    if pa.types.is_decimal128(t):
        return f"decimal({t.precision},{t.scale})"
    for name, known in _SIMPLE.items():
        if t == known:
            return name
    raise InvalidKeyType(
        f"column type {t} is not supported by the platform; cast it to one of {SUPPORTED} "
        "in the upstream table"
    )


def schema_of(columns: list[tuple[str, str]], nullable: bool = True) -> pa.Schema:
    """An Arrow schema from (name, type name) pairs."""
    return pa.schema([pa.field(n, arrow_type(t), nullable=nullable) for n, t in columns])


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """Map view/large types to the plain types that Delta stores (load_cdf returns views)."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(pa.field(f.name, t, nullable=f.nullable))
    return pa.schema(fields)


def decimal_units(column: pa.ChunkedArray) -> list[int]:
    """The unscaled ints of a non-null decimal128 column, read from its 16-byte two's
    complement values (a Decimal per value costs more than the whole aggregate)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    raw = np.frombuffer(array.buffers()[1], dtype="<i8").reshape(-1, 2)
    raw = raw[array.offset:array.offset + len(array)]
    low, high = raw[:, 0], raw[:, 1]
    out = low.tolist()
    for j in np.flatnonzero(high != (low >> 63)).tolist():  # beyond int64
        out[j] = (int(high[j]) << 64) + (int(low[j]) & (2**64 - 1))
    return out
