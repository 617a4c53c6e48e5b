"""The chunked modes' snapshot reads: a seek in the files of the table a chunk comes from
(the arrangement replica, or the upstream itself in no_shuffle), read into Spark
(``seek_chunk``) or projected and written into the MV by Python tasks (``write_seek_chunk``).
Shared by the chunked modes' sources (step/modes/arrangement.py, no_shuffle.py), which differ only
in the table and version they seek in.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

from backfill_assets import storage
from backfill_assets.arrow.expressions import NotExact
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import BAD_KEY, ROW_NUMBER
from backfill_assets.core.positions import rows_to_see
from backfill_assets.engine.projection import exact_projection
from backfill_assets.step.source_context import SeekRead, SourceContext
from backfill_assets.storage import col, replica


def seek_chunk(ctx: SourceContext, uri: str, version: int | None,
               positions: Mapping[int, Key | None], key_order: KeyOrder, limit: int,
               shared: bool) -> tuple[DataFrame, int]:
    """A chunk read from the files that can hold it (storage.seek), typed as the replica's
    columns, plus ROW_NUMBER and BAD_KEY; clustered by vnode range, (vnode, key) order per task. A
    replica's change rows are resolved with its base rows in the tasks."""
    snap, files, changes = _seek_side(ctx, uri, version, positions)
    schema = replica_schema(ctx.upstream_schema)
    picked = storage.chunk_files(files, key_order, positions, limit, shared,
                                 None if changes is None else replica.tombstones(changes))
    rows = storage.read_chunk(ctx.spark, snap, schema.names, key_order, positions, limit,
                              picked, shared, changes)
    typed = [col(f.name).cast(storage.spark_type(f.type)).alias(f.name) for f in schema]
    return rows.select(*typed, ROW_NUMBER, BAD_KEY), picked.rows_scanned


def write_seek_chunk(ctx: SourceContext, uri: str, version: int | None,
                     positions: Mapping[int, Key | None], key_order: KeyOrder, limit: int,
                     d: MVDefinition, mv: storage.TableVersion, tail: int = 0, shared: bool = False
                     ) -> tuple[storage.BulkWritten, SeekRead] | None:
    """The chunk read, projected in Arrow and written into ``mv`` by Python tasks (the first
    phase of the MV commit, as a bulk step's), with the rows of the files read; None when
    the definition does not compile to Arrow, or (``shared``) a candidate's pk is null (the
    Spark path names it). TransformRefused: nothing written. ``tail``: a vnode whose whole
    rest fits in ``limit + tail`` keeps it. ``shared`` (no_shuffle): the driver cuts the
    run's ``limit`` rows from the candidates' key columns (storage/chunks/shared_cut.py), and each
    vnode's task reads only the files holding a row of the chunk and keeps its rows up to
    the cut; when the tasks run in this process, the cut reads whole rows and holds the
    chunk's, and the tasks take theirs from it (each file read once)."""
    projection = exact_projection(ctx.spark, d, ctx.upstream_schema)
    if projection is None:
        return None
    snap, files, changes = _seek_side(ctx, uri, version, positions)
    if shared and changes is not None:
        raise ValueError("a shared chunk reads the upstream, never a replica's change rows")
    picked = storage.chunk_files(files, key_order, positions, rows_to_see(limit, tail), shared,
                                 None if changes is None else replica.tombstones(changes))
    columns = replica_schema(ctx.upstream_schema).names
    write = functools.partial(storage.write_chunk, ctx.spark, transform=projection.project,
                              refusal=NotExact, table_uri=mv.uri,
                              storage_options=mv.storage_options, schema=mv.arrow_schema,
                              max_rows_per_file=storage.file_rows_for(snap.live_rows))
    cut = None
    if shared:  # run here, the cut holds the chunk's rows: each file is read once
        threads = storage.local_threads(ctx.spark, picked.rows_scanned)
        pos = next(iter(positions.values()), None)
        if threads:  # whole rows held here, across barriers (storage/chunks/cut_window.py)
            def pick(n: int) -> tuple[list[storage.DataFile], dict]:
                more = picked if n == limit else storage.chunk_files(
                    files, key_order, positions, rows_to_see(n, tail), shared)
                return more.distinct, more.floors

            needed = [c for c in columns if c in projection.inputs or c in key_order.names
                      or c == storage.VNODE]  # what the window holds: the MV's input only
            cut = storage.windowed_cut(snap, key_order, list(positions), pos, limit, pick,
                                       storage.file_reader(snap, needed), needed)
        else:
            cut = storage.shared_cut(snap, picked.distinct, key_order, list(positions), pos,
                                     limit, picked.floors)
        if cut.null_key:
            return None
        picked = picked.only(lambda f: f.path in cut.files)  # those holding a chunk row
        if cut.held is not None:
            held = storage.HeldChunk(cut.held, key_order)
            return write(held.tasks(threads), held, threads=threads), \
                SeekRead(cut.rows_read, cut.window_rows)
    tasks, reader = storage.chunk_tasks(snap, columns, key_order, positions, limit, picked,
                                        shared, changes, storage.parallelism(ctx.spark), tail,
                                        cut)
    # reported: the rows of every file read, the cut's (key columns) included
    scanned = picked.rows_scanned if cut is None else cut.rows_read
    return write(tasks, reader, rows_read=picked.rows_scanned), SeekRead(scanned)


def _seek_side(ctx: SourceContext, uri: str, version: int | None, vnodes: Mapping[int, object]
               ) -> tuple[storage.TableVersion, list[storage.DataFile], pa.Table | None]:
    """The table a chunk seeks in, its files to seek, and (a replica) its change rows."""
    snap = storage.TableVersion.load(uri, version, ctx.tables.storage_options)
    if replica.VERSION not in snap.arrow_schema.names:
        return snap, snap.files, None
    return snap, replica.base_files(snap), replica.read_changes(snap, vnodes)


def replica_schema(upstream_schema: pa.Schema) -> pa.Schema:
    """The replica's data: every upstream column (minus any upstream vnode) plus our vnode
    (its table adds the version columns of storage/rows/replica.py)."""
    fields = [f for f in upstream_schema if f.name != "vnode"]
    return pa.schema([*(f.with_nullable(True) for f in fields), pa.field("vnode", pa.int32())])
