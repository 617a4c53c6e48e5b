"""Arrow <-> Spark types: the one mapping the storage layer reads and writes with."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T


def col(name: str) -> Column:
    """The column ``name`` exactly: backquoted, a backquote in it doubled (a plain
    ``F.col(name)`` reads dots as struct fields, and a bare backquote breaks the name)."""
    return F.col("`" + name.replace("`", "``") + "`")


def spark_type(t: pa.DataType) -> T.DataType:
    """The Spark type of an Arrow type (the platform's types, plus a few widths)."""
    simple = [(pa.types.is_int8, T.ByteType), (pa.types.is_int16, T.ShortType),
              (pa.types.is_int32, T.IntegerType), (pa.types.is_int64, T.LongType),
              (pa.types.is_float32, T.FloatType), (pa.types.is_float64, T.DoubleType),
              (pa.types.is_boolean, T.BooleanType), (pa.types.is_date32, T.DateType),
              (pa.types.is_null, T.NullType)]
    for test, spark in simple:
        if test(t):
            return spark()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return T.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return T.BinaryType()
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    raise TypeError(f"Arrow type {t} has no Spark mapping on this platform")


def spark_schema(schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema])


def arrow_type_for_spark(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark exchanges for a column stored as ``t`` (microsecond timestamps,
    UTC for zoned ones: the session time zone is UTC; plain strings and binaries)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    return t


def exchange_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type_for_spark(f.type)) for f in schema])
