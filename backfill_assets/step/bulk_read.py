"""Snapshot mode, Spark side of one bulk step: read every remaining row, no sort, no cache.

The chunked modes select a chunk with a window sorted by key (to cut it at `chunk_size` rows
and find the last key) and cache it; a bulk read takes everything, so it needs neither: the
rows go straight from the upstream's files through the MV projection into the MV's files.
What the driver needs back (rows and last key per vnode, whether a pk is null) comes from one
aggregate over the key columns only (`max_by` with `core.snapshot.last_key_sort_sql`), i.e. a
scan of a few columns and one row per vnode through the shuffle.

Duplicate pks need a group-by over every key (a shuffle of all keys): it runs unless every row
of the upstream came from the platform's own writer, which refuses them
(`upstream.layout.keys_kept_unique`: a platform table with the MV's pk whose row-adding commits all
carry its marker). Not caught therefore: duplicates written by another engine in commits the
log no longer holds.

`replacing` makes the changes of a re-snapshot: the vnodes' new rows replace their old ones in
one MV commit, so a crash leaves either the old or the new state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.core import names
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.snapshot import last_key_sort_sql
from backfill_assets.engine.projection import rows_after
from backfill_assets.step.key_checks import check_snapshot_keys
from backfill_assets.storage import col


def read_remainder(rows: DataFrame, keys: DataFrame, positions: Mapping[int, Key | None],
                   key_order: KeyOrder, *, unique_keys: bool, uri: str, version: int,
                   key_stats: Mapping[int, tuple[int, Key, bool]] | None = None
                   ) -> tuple[DataFrame, dict[int, tuple[int, Key]]]:
    """The rows of each vnode after its position (all rows without one) and, per vnode that
    has any, (rows, last key in key order), computed from ``keys`` (the same rows' pk and
    vnode columns only: a read of a few columns instead of a second pass over every one).
    ``key_stats``: the same per vnode, with a flag for a null or repeated pk, already
    computed by the read tasks (``storage.vnode_key_stats``): then no Spark pass at all.
    Refuses null or (unless `unique_keys`) duplicate pks with BadPrimaryKeyInUpstream before
    anything is written."""
    if any(p is not None for p in positions.values()):
        rows = rows_after(rows, positions, key_order)
        keys = rows_after(keys, positions, key_order)
    if key_stats is not None:
        if any(bad for _, _, bad in key_stats.values()):
            check_snapshot_keys(keys, key_order.names, uri, version)  # names the key, raises
        return rows, {v: (n, last) for v, (n, last, _) in key_stats.items()}
    if not unique_keys:
        check_snapshot_keys(keys, key_order.names, uri, version)
    stats = _vnode_stats(keys, key_order)
    if any(s["_null"] for s in stats):
        check_snapshot_keys(keys, key_order.names, uri, version)  # names the key and raises
    key_names = key_order.names
    return rows, {s["vnode"]: (s["_n"], tuple(s["_last"][k] for k in key_names)) for s in stats}


def _vnode_stats(rows: DataFrame, key_order: KeyOrder) -> list[dict]:
    """One aggregate: per vnode the row count, the last key and whether a pk is null."""
    keys = [col(k) for k in key_order.names]
    order = F.struct(*[F.expr(e).alias(f"_o{i}")
                       for i, e in enumerate(last_key_sort_sql(key_order))])
    null = F.greatest(*[k.isNull().cast("int") for k in keys]) if len(keys) > 1 else \
        keys[0].isNull().cast("int")
    agg = rows.groupBy("vnode").agg(F.count(F.lit(1)).alias("_n"),
                                    F.max_by(F.struct(*keys), order).alias("_last"),
                                    F.max(null).alias("_null"))
    return agg.toArrow().to_pylist()


def replacing(spark: SparkSession, mv: storage.TableVersion, rows: DataFrame | None,
              vnodes: Sequence[int], key_names: Sequence[str]) -> DataFrame:
    """Keyed changes that turn the MV's rows of `vnodes` into `rows` (the vnodes re-read from
    scratch): every new row upserted (the storage layer skips an upsert equal to the row it
    replaces, so the MV's change feed shows only real differences), every old key that is
    gone deleted; one `apply_changes` commit then replaces the vnodes atomically."""
    keys = ["vnode", *key_names]
    old = storage.read_version(spark, mv.uri, mv.version, mv.arrow_schema, vnodes=vnodes,
                               storage_options=mv.storage_options)
    if rows is None:
        return old.withColumn(names.OP, F.lit("delete"))
    quoted = [col(k) for k in keys]
    gone = old.join(rows.select(*quoted), on=keys, how="left_anti")
    return rows.withColumn(names.OP, F.lit("upsert")).unionByName(
        gone.withColumn(names.OP, F.lit("delete")))
