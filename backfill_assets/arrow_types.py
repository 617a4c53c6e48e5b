"""Column type names of the platform <-> Arrow types.

The pure core speaks in type names ("bigint", "decimal(10,2)"); Delta and Spark speak Arrow.
This is the one translation between them, so a type accepted in one place is accepted in all.
"""

from __future__ import annotations

import re

import pyarrow as pa

from backfill_assets.errors import InvalidKeyType

_SIMPLE: dict[str, pa.DataType] = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "string": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type stored for a platform type name."""
    if name in _SIMPLE:
        return _SIMPLE[name]
    match = _DECIMAL.match(name)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise InvalidKeyType(
        f"column type {name!r} is not supported; use one of int, bigint, string, date, "
        "timestamp, double, boolean or decimal(p,s)"
    )


def type_name(t: pa.DataType) -> str:
    """The platform type name of an Arrow type (the inverse of arrow_type, up to width)."""
    if pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
        return "int"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    raise InvalidKeyType(
        f"column type {t} is not supported by the platform; cast it to int, bigint, string, "
        "date, timestamp, double, boolean or decimal(p,s) in the upstream table"
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
