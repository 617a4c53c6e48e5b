"""Where a step's snapshot comes from: the two backfill modes differ only here.

- `ReplicaSource` (arrangement): the backfill keeps its own arrangement of the upstream,
  `replicated_state`, partitioned by vnode; a vnode's replica is copied from the upstream at
  the first barrier that touches it and then kept current by replicating every barrier's change
  chunk. Any Delta upstream with a change feed works, whatever its layout.
- `UpstreamSource` (no_shuffle): the upstream is already arranged by the same vnodes, so the
  snapshot is a time-travel read of the upstream version itself; nothing is replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from backfill_assets import mv_store, spark_ops
from backfill_assets.mv_store import MVTables
from backfill_assets.spark_delta_writer import (
    CLUSTERED_FILE_ROWS,
    append_dataframe,
    clustered,
    merge_dataframe,
)


@dataclass
class SourceContext:
    """What a snapshot source needs to know about the step it serves."""

    spark: SparkSession
    mv_name: str
    tables: MVTables
    key_names: Sequence[str]
    key_types: Sequence[str]
    vnode_count: int
    upstream_schema: pa.Schema
    v_new: int


class SnapshotSource(Protocol):
    """Prepares and serves the rows a snapshot chunk is selected from."""

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | None, hook) -> int:
        """Bring the snapshot side of `replicate_from`'s vnodes to `ctx.v_new`; rows written."""

    def rows(self, ctx: SourceContext, vnodes: Sequence[int]) -> DataFrame:
        """All rows of `vnodes` at `ctx.v_new`, with a `vnode` column."""


def replica_schema(upstream_schema: pa.Schema) -> pa.Schema:
    """The replica keeps every upstream column (minus any upstream vnode) plus our vnode."""
    fields = [f for f in upstream_schema if f.name != "vnode"]
    return pa.schema([*(f.with_nullable(True) for f in fields), pa.field("vnode", pa.int32())])


class ReplicaSource:
    """Arrangement backfill: snapshot reads come from the backfill's own replica."""

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | None, hook) -> int:
        table = mv_store.ensure_table(ctx.tables.replica, replica_schema(ctx.upstream_schema),
                                      ctx.tables.storage_options, cdf=False)
        done = mv_store.txn_versions(table, ctx.mv_name, "replica", replicate_from)
        fresh = sorted(v for v, d in done.items() if d is None)
        behind = {v: d for v, d in done.items() if d is not None and d < ctx.v_new}
        written = 0
        if fresh:
            written += self._initialise(ctx, table, fresh)
            table = mv_store.open_table(ctx.tables.replica, ctx.tables.storage_options)
        if behind and changes is not None:
            written += self._replicate(ctx, table, behind, changes)
        hook("after_replica_commit")
        return written

    def _initialise(self, ctx: SourceContext, table, vnodes: list[int]) -> int:
        """Copy the upstream at v_new for vnodes the replica has never seen."""
        up = spark_ops.read_version(ctx.spark, ctx.tables.upstream, ctx.v_new,
                                    ctx.upstream_schema, storage_options=ctx.tables.storage_options)
        up = _with_vnode(up, ctx).where(mv_store.vnode_in(vnodes))
        # small key-range files: a replicated change then rewrites one of them
        props = mv_store.commit_properties(ctx.mv_name, "replica", vnodes, ctx.v_new)
        return append_dataframe(clustered(up, ctx.key_names), table, props,
                                max_rows_per_file=CLUSTERED_FILE_ROWS)

    def _replicate(self, ctx: SourceContext, table, behind: Mapping[int, int],
                   changes: DataFrame) -> int:
        """Apply the change chunk (d_k, v_new] of every vnode k to the replica (all keys)."""
        from backfill_assets.mv_spark import with_vnode_versions

        rows = spark_ops.net_changes(with_vnode_versions(changes, behind), ctx.key_names)
        cols = [f.name for f in replica_schema(ctx.upstream_schema)]
        rows = rows.select(*[f"`{c}`" for c in cols], "_op").cache()
        try:
            props = mv_store.commit_properties(ctx.mv_name, "replica", sorted(behind), ctx.v_new)
            merge_dataframe(rows, table, ctx.key_names, props)
            return rows.count()
        finally:
            rows.unpersist()

    def rows(self, ctx: SourceContext, vnodes: Sequence[int]) -> DataFrame:
        schema = replica_schema(ctx.upstream_schema)
        return spark_ops.read_version(ctx.spark, ctx.tables.replica, None, schema,
                                      vnodes=vnodes, storage_options=ctx.tables.storage_options)


class UpstreamSource:
    """No-shuffle backfill: snapshot reads are time-travel reads of the upstream itself."""

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | None, hook) -> int:
        # the layout was checked before anything was written (upstream_check)
        hook("after_replica_commit")
        return 0

    def rows(self, ctx: SourceContext, vnodes: Sequence[int]) -> DataFrame:
        schema = replica_schema(ctx.upstream_schema)  # the upstream's columns + its own vnode
        return spark_ops.read_version(ctx.spark, ctx.tables.upstream, ctx.v_new, schema,
                                      vnodes=vnodes,
                                      storage_options=ctx.tables.storage_options)


def _with_vnode(df: DataFrame, ctx: SourceContext) -> DataFrame:
    """Recompute the vnode from the pk with the MV's vnode count (the upstream's may differ)."""
    return spark_ops.with_vnode(df, ctx.key_names, ctx.key_types, ctx.vnode_count)


SOURCES: dict[str, SnapshotSource] = {
    "arrangement": ReplicaSource(),
    "no_shuffle": UpstreamSource(),
}
