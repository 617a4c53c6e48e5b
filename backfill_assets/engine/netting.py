"""Spark adapter: the vnode column and netting of change-feed rows. Reading a Delta version
into Spark is the storage layer's (``backfill_assets.storage``: ``read_version``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.arrow.types import type_name
from backfill_assets.core.names import OP, RANK, ROW_NUMBER
from backfill_assets.core.vnode import spark_vnode_sql
from backfill_assets.storage import VNODE, col, spark_schema

__all__ = ["net_changes", "read_changes", "vnode_column", "with_vnode"]

UPSERT_TYPES = ("insert", "update_postimage")
DELETE_TYPES = ("delete", "update_preimage")


def vnode_column(key_columns: Sequence[Any], vnode_count: int) -> Column:
    """The vnode of each row (INT), by the stable hash of the key columns (``KeyColumn``-like:
    ``.name``, ``.type``); equal to ``core.vnode.vnode_of`` for every key."""
    names = [k.name for k in key_columns]
    types = [k.type for k in key_columns]
    return F.expr(spark_vnode_sql(names, types, vnode_count))


def with_vnode(df: DataFrame, key_names: Sequence[str], key_types: Sequence[str],
               vnode_count: int) -> DataFrame:
    """``df`` with its ``vnode`` column (re)computed from the key."""
    return df.withColumn(VNODE, F.expr(spark_vnode_sql(key_names, key_types, vnode_count)))


def net_changes(df: DataFrame, key_names: Sequence[str]) -> DataFrame:
    """Net change-feed rows per key: the last change of a key wins (highest
    ``_commit_version``; within one version an insert/update_postimage wins over a
    delete/update_preimage). A pk-changing update is thereby a delete of the old key plus an
    upsert of the new one. Output: the input columns without ``_change_type`` /
    ``_commit_timestamp``, plus ``OP`` ('upsert' | 'delete'); ``_commit_version`` is kept."""
    rank = F.when(F.col("_change_type").isin(*UPSERT_TYPES), F.lit(0)).otherwise(F.lit(1))
    order = Window.partitionBy(*[col(k) for k in key_names]).orderBy(
        F.col("_commit_version").desc(), F.col(RANK).asc()
    )
    ranked = df.withColumn(RANK, rank).withColumn(ROW_NUMBER, F.row_number().over(order))
    op = F.when(F.col(RANK) == 0, F.lit("upsert")).otherwise(F.lit("delete"))
    out = ranked.where(F.col(ROW_NUMBER) == 1).withColumn(OP, op)
    return out.drop(ROW_NUMBER, RANK, "_change_type", "_commit_timestamp")


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
    row per key with ``OP`` ('upsert' | 'delete'), the full row, ``vnode`` and
    ``_commit_version``. Raises ChangeFeedDisabled / HistoryUnavailable
    (``storage.read_raw_changes``)."""
    table = storage.open_table(uri, storage_options=storage_options)
    schema = storage.arrow_schema(table)
    config = table.metadata().configuration
    key_types = [type_name(schema.field(k).type) for k in key_names]
    vnode_list = sorted({int(v) for v in vnodes}) if vnodes is not None else None
    platform_vnodes = (
        VNODE in schema.names
        and storage.PK_PROPERTY in config
        and [str(k) for k in key_names] == _json_list(config[storage.PK_PROPERTY])
        and str(config.get(storage.VNODE_COUNT_PROPERTY)) == str(vnode_count)
    )
    raw = storage.read_raw_changes(
        uri, start_exclusive, end, vnodes=vnode_list if platform_vnodes else None,
        storage_options=storage_options)
    raw = raw.drop_columns([c for c in ("_commit_timestamp",) if c in raw.column_names])
    df = spark.createDataFrame(raw, schema=spark_schema(raw.schema))
    if not platform_vnodes:
        df = with_vnode(df, key_names, key_types, vnode_count)
    if vnode_list is not None:
        df = df.where(F.col(VNODE).isin(vnode_list))
    return net_changes(df, key_names)


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
