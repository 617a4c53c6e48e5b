"""Arrangement mode: per-vnode positions over the backfill's own replica of the upstream.

The backfill keeps its own arrangement of the upstream, `replicated_state`, in key-sorted files
of one vnode each; a vnode's replica is copied from the upstream at the first barrier that
touches it (with that barrier's first chunk) and then kept current by appending every
barrier's netted change chunk as change rows (storage/rows/replica.py). Any Delta upstream
with a change feed works, whatever its layout, and vnode ranges can be re-split between runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import OP, VNODE
from backfill_assets.core.positions import PerVnodePositions
from backfill_assets.engine import netting
from backfill_assets.mv import owned_tables
from backfill_assets.step.key_checks import check_snapshot_keys
from backfill_assets.step.request import Hook, Mode
from backfill_assets.step.seek_chunk import replica_schema, seek_chunk, write_seek_chunk
from backfill_assets.step.source_context import SeekRead, SourceContext
from backfill_assets.storage import col, replica
from backfill_assets.upstream import same_vnodes


class ReplicaSource:
    """Arrangement backfill: snapshot reads come from the backfill's own replica, a
    log-structured table (storage/rows/replica.py): base rows copied once per vnode, each
    barrier's changes appended as change rows, resolved on read."""

    checks_keys = False  # the loop checks a fresh vnode's snapshot before its copy
    writes_chunks = True

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | pa.Table | None, hook: Hook) -> int:
        if not replicate_from:  # every vnode finished: the replica is not read again
            hook("after_replica_commit")
            return 0
        table = owned_tables.ensure_data_table(
            ctx.tables.replica, replica.table_schema(replica_schema(ctx.upstream_schema)),
            ctx.tables.storage_options, cdf=False, key_names=ctx.key_names,
            vnode_count=ctx.vnode_count,
            layout={storage.SEEK_ROWS_PROPERTY: str(storage.seek_file_rows(ctx.chunk_limit))},
        )
        table = replica.with_version_columns(table)
        done = owned_tables.txn_versions(table, ctx.mv_name, "replica", replicate_from)
        fresh = sorted(v for v, d in done.items() if d is None)
        behind = {v: d for v, d in done.items() if d is not None and d < ctx.v_new}
        written = 0
        if fresh:
            written += self._initialise(ctx, table, fresh)
            table = storage.open_mor_table(ctx.tables.replica, ctx.tables.storage_options)
        if behind and changes is not None:
            written += self._replicate(ctx, table, behind, changes)
        hook("after_replica_commit")
        return written

    def _initialise(self, ctx: SourceContext, table, vnodes: list[int]) -> int:
        """Copy the upstream at v_new for vnodes the replica has never seen: by Python tasks
        alone when the upstream is arranged by the MV's vnodes (each reads a vnode range,
        sorts it by key and writes one-vnode files), else through Spark."""
        so = ctx.tables.storage_options
        snap = storage.TableVersion.load(ctx.tables.upstream, ctx.v_new, so)
        intent = owned_tables.intent(ctx.mv_name, "replica", vnodes, ctx.v_new)
        target = storage.TableVersion(ctx.tables.replica, so, table)
        seek_rows = int(target.configuration.get(storage.SEEK_ROWS_PROPERTY)
                        or storage.seek_file_rows(ctx.chunk_limit))
        data = replica_schema(ctx.upstream_schema)
        if same_vnodes(ctx.tables.upstream, ctx.v_new, ctx.key_names, ctx.vnode_count, so):
            rows = storage.BulkRows(snap, tuple(vnodes), tuple(snap.arrow_schema.names),
                                    _AsReplica(data, ctx.v_new), ctx.key_order)
            if ctx.first_chunk is not None:  # the first chunk from the same sorted rows
                written, first = storage.write_copy(
                    ctx.spark, rows, target.uri, so, target.arrow_schema,
                    max_rows_per_file=seek_rows,
                    first=replace(ctx.first_chunk, boundary=seek_rows))
                if first is not None:
                    ctx.first_written = (frozenset(vnodes), first)
            else:
                written = storage.write_bulk(ctx.spark, rows, target.uri, so,
                                             target.arrow_schema, max_rows_per_file=seek_rows,
                                             split_column=VNODE, key_bounds=True)
            if written.bad_keys:
                written.discard()
                check_snapshot_keys(ctx.with_vnode(storage.read_table_version(
                    ctx.spark, snap, ctx.upstream_schema.names)).where(
                    owned_tables.vnode_in(vnodes)), ctx.key_names, ctx.tables.upstream, ctx.v_new)
                raise AssertionError("the replica's tasks flagged a pk the key check did not find")
            storage.commit_written(target, intent, written)
            return sum(f.rows for f in written.files)
        up = storage.read_table_version(ctx.spark, snap, ctx.upstream_schema.names)
        up = ctx.with_vnode(up).where(owned_tables.vnode_in(vnodes))
        up = up.withColumn(replica.VERSION, F.lit(ctx.v_new).cast("long")).withColumn(
            replica.DELETED, F.lit(False))
        estimate = snap.live_rows * len(vnodes) // ctx.vnode_count
        return storage.append(ctx.spark, target, up, ctx.key_names, intent,
                              estimate).rows_written

    def _replicate(self, ctx: SourceContext, table, behind: Mapping[int, int],
                   changes: DataFrame | pa.Table) -> int:
        """Append the change chunk (d_k, v_new] of every vnode k, netted per key, as change
        rows as of v_new (few change rows: netted in Arrow on the driver; else in Spark)."""
        intent = owned_tables.intent(ctx.mv_name, "replica", sorted(behind), ctx.v_new)
        target = storage.TableVersion(ctx.tables.replica, ctx.tables.storage_options, table)
        schema = target.arrow_schema
        if isinstance(changes, pa.Table):
            from backfill_assets.arrow.netting import net_with_prior, newer_than, rows_by_keys

            netted = net_with_prior(newer_than(changes, behind), ctx.key_names)
            gone = rows_by_keys(netted.before, netted.after, ctx.key_names, "left anti")
            rows = replica.change_rows(netted.after, gone, ctx.v_new, schema)
        else:
            from backfill_assets.engine.projection import with_vnode_versions

            netted = netting.net_changes(with_vnode_versions(changes, behind), ctx.key_names)
            rows = netted.select(*[col(c) for c in replica.data_columns(schema)],
                                 F.lit(ctx.v_new).cast("long").alias(replica.VERSION),
                                 (F.col(OP) == "delete").alias(replica.DELETED))
        written = replica.append_changes(target, rows, intent)
        replica.merge_changes(storage.TableVersion.load(target.uri, None, target.storage_options),
                              ctx.key_order, storage.Intent())
        return written

    def chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None], key_order: KeyOrder,
              limit: int, shared: bool) -> tuple[DataFrame, int]:
        return seek_chunk(ctx, ctx.tables.replica, None, positions, key_order, limit, shared)

    def write_chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None],
                    key_order: KeyOrder, limit: int, d: MVDefinition, mv: storage.TableVersion,
                    tail: int = 0, shared: bool = False
                    ) -> tuple[storage.BulkWritten, SeekRead] | None:
        return write_seek_chunk(ctx, ctx.tables.replica, None, positions, key_order, limit, d,
                                mv, tail, shared)


class _AsReplica:
    """A bulk transform (picklable): upstream rows as the replica's base rows at a version."""

    keeps_every_row = True  # in the order it gets them: the bulk task sorts them once

    def __init__(self, data: pa.Schema, version: int):
        self.data, self.version = data.serialize().to_pybytes(), version

    def __call__(self, rows: pa.Table) -> pa.Table:
        data = pa.ipc.read_schema(pa.py_buffer(self.data))
        return replica.tagged(rows.select(data.names).cast(data), self.version)


ARRANGEMENT = Mode("arrangement", PerVnodePositions, ReplicaSource())
