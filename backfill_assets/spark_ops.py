"""Spark adapter: the vnode column, reading a Delta version as parquet, netting changes.

Spark never reads format "delta" here (the Delta jars are not available): a version is the set
of parquet files delta-rs lists for it, read with an explicit schema and ``basePath`` so the
``vnode`` partition column comes back from the folder names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill_assets import delta_store
from backfill_assets.arrow_types import type_name
from backfill_assets.core.vnode import spark_vnode_sql

VNODE_COLUMN = delta_store.VNODE_COLUMN
UPSERT_TYPES = ("insert", "update_postimage")
DELETE_TYPES = ("delete", "update_preimage")


def spark_type(t: pa.DataType) -> T.DataType:
    """The Spark type of an Arrow type (the platform's types, plus a few widths)."""
    if pa.types.is_int8(t):
        return T.ByteType()
    if pa.types.is_int16(t):
        return T.ShortType()
    if pa.types.is_int32(t):
        return T.IntegerType()
    if pa.types.is_int64(t):
        return T.LongType()
    if pa.types.is_float32(t):
        return T.FloatType()
    if pa.types.is_float64(t):
        return T.DoubleType()
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return T.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return T.BinaryType()
    if pa.types.is_date32(t):
        return T.DateType()
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    raise TypeError(f"Arrow type {t} has no Spark mapping on this platform")


def spark_schema(schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema])


def vnode_column(key_columns: Sequence[Any], vnode_count: int) -> Column:
    """The vnode of each row (INT), by the stable hash of the key columns (``KeyColumn``-like:
    ``.name``, ``.type``); equal to ``core.vnode.vnode_of`` for every key."""
    names = [k.name for k in key_columns]
    types = [k.type for k in key_columns]
    return F.expr(spark_vnode_sql(names, types, vnode_count))


def with_vnode(df: DataFrame, key_names: Sequence[str], key_types: Sequence[str],
               vnode_count: int) -> DataFrame:
    """``df`` with its ``vnode`` column (re)computed from the key."""
    return df.withColumn(VNODE_COLUMN, F.expr(spark_vnode_sql(key_names, key_types, vnode_count)))


def _spark_path(uri: str) -> str:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://"):]
    return uri


def read_version(
    spark: SparkSession,
    uri: str,
    version: int | None,
    schema: pa.Schema | None = None,
    vnodes: Iterable[int] | None = None,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The rows of ``version`` (latest when None) of the Delta table at ``uri``, restricted to
    ``vnodes`` when given (partition-pruned when the table is partitioned by vnode; the table
    must then have a ``vnode`` column). ``schema`` defaults to the table's schema at that
    version. An empty version gives an empty DataFrame with the schema."""
    vnode_list = sorted({int(v) for v in vnodes}) if vnodes is not None else None
    if schema is None:
        schema = delta_store.arrow_schema(delta_store.open_table(uri, version, storage_options))
    struct = spark_schema(schema)
    files = delta_store.version_files(uri, version, vnode_list, storage_options)
    if not files:
        return spark.createDataFrame([], struct)
    df = (spark.read.schema(struct).option("basePath", _spark_path(uri))
          .parquet(*[_spark_path(f) for f in files]))
    if vnode_list is not None:
        if VNODE_COLUMN not in schema.names:
            raise ValueError(
                f"read_version of {uri} with vnodes needs a {VNODE_COLUMN!r} column in the schema"
            )
        df = df.where(F.col(VNODE_COLUMN).isin(vnode_list))
    return df


def net_changes(df: DataFrame, key_names: Sequence[str]) -> DataFrame:
    """Net change-feed rows per key: the last change of a key wins (highest
    ``_commit_version``; within one version an insert/update_postimage wins over a
    delete/update_preimage). A pk-changing update is thereby a delete of the old key plus an
    upsert of the new one. Output: the input columns without ``_change_type`` /
    ``_commit_timestamp``, plus ``_op`` ('upsert' | 'delete'); ``_commit_version`` is kept."""
    rank = F.when(F.col("_change_type").isin(*UPSERT_TYPES), F.lit(0)).otherwise(F.lit(1))
    order = Window.partitionBy(*[F.col(f"`{k}`") for k in key_names]).orderBy(
        F.col("_commit_version").desc(), F.col("_rank").asc()
    )
    ranked = df.withColumn("_rank", rank).withColumn("_rn", F.row_number().over(order))
    op = F.when(F.col("_rank") == 0, F.lit("upsert")).otherwise(F.lit("delete"))
    out = ranked.where(F.col("_rn") == 1).withColumn("_op", op)
    return out.drop("_rn", "_rank", "_change_type", "_commit_timestamp")


def read_changes(
    spark: SparkSession,
    uri: str,
    start_exclusive: int,
    end: int,
    vnodes: Iterable[int] | None,
    key_names: Sequence[str],
    vnode_count: int,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The netted changes ``(start_exclusive, end]`` of the given vnodes (all when None): one
    row per key with ``_op`` ('upsert' | 'delete'), the full row, ``vnode`` and
    ``_commit_version``. Raises ChangeFeedDisabled / HistoryUnavailable (delta_store)."""
    table = delta_store.open_table(uri, storage_options=storage_options)
    schema = delta_store.arrow_schema(table)
    config = table.metadata().configuration
    key_types = [type_name(schema.field(k).type) for k in key_names]
    vnode_list = sorted({int(v) for v in vnodes}) if vnodes is not None else None
    platform_vnodes = (
        VNODE_COLUMN in schema.names
        and delta_store.PK_PROPERTY in config
        and [str(k) for k in key_names] == _json_list(config[delta_store.PK_PROPERTY])
        and str(config.get(delta_store.VNODE_COUNT_PROPERTY)) == str(vnode_count)
    )
    predicate = None
    if platform_vnodes and vnode_list is not None:
        predicate = delta_store.vnode_predicate(vnode_list)
    raw = delta_store.read_raw_changes(uri, start_exclusive, end, predicate=predicate,
                                       storage_options=storage_options)
    raw = raw.drop_columns([c for c in ("_commit_timestamp",) if c in raw.column_names])
    df = spark.createDataFrame(raw, schema=spark_schema(raw.schema))
    if not platform_vnodes:
        df = with_vnode(df, key_names, key_types, vnode_count)
    if vnode_list is not None:
        df = df.where(F.col(VNODE_COLUMN).isin(vnode_list))
    return net_changes(df, key_names)


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
