"""The snapshot side of a step: the next chunk after each unfinished vnode's position.

Chunked modes read a bounded, key-ordered chunk per vnode by a seek (`snapshot_chunk`: only the
files that can hold it, storage.seek; sorted in the read tasks and handed on already clustered,
storage.chunk_read; no_shuffle's shared limit is cut on the driver from key columns,
storage.shared_cut, or in Spark with `first_rows` when the chunk cannot go to Arrow); snapshot mode
reads each vnode's remainder whole (`bulk_chunk`). Both come back as a projected DataFrame
plus per-vnode stats (rows read, last key) for the position strategy; rows never pass through
the driver. A bulk step of fresh vnodes under a definition that compiles to Arrow skips the
DataFrame: Python tasks write its MV files and report the stats (`arrow_chunk`, the first
phase of the step's commit).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

from backfill_assets import storage
from backfill_assets.arrow.expressions import NotExact
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.planning import StepPlan
from backfill_assets.core.positions import VnodeChunk
from backfill_assets.core.progress import BackfillState, InProgress
from backfill_assets.engine import netting
from backfill_assets.engine.projection import (
    BAD_KEY,
    chunk_stats,
    exact_projection,
    first_rows,
    project,
)
from backfill_assets.mv import owned_tables
from backfill_assets.step.bulk_read import read_remainder
from backfill_assets.step.key_checks import check_snapshot_keys, refuse_flagged_chunk_key
from backfill_assets.step.request import StepReport
from backfill_assets.step.source_context import (
    ChunkSource,
    SnapshotSource,
    SourceContext,
    WholeSource,
)
from backfill_assets.upstream import keys_kept_unique


@dataclass
class Chunk:
    """What a step's snapshot read produced."""

    rows: DataFrame | None  # projected rows + KEEP, ROW_NUMBER, BAD_KEY, cached; None: no rows
    read: int
    stats: dict
    scanned: int | None = None  # rows of the files a seek read (None: not a seek)
    clustered: bool = False  # each Spark partition one vnode range in (vnode, key) order
    written: storage.BulkWritten | None = None  # written in Arrow, not committed (arrow_chunk)
    engine: str | None = None  # how a bulk chunk was projected: "arrow", or "spark" (and why)
    window_rows: int = 0  # rows a no_shuffle read holds for the next barriers (cut_window)

    def record(self, report: StepReport, on_driver: bool) -> None:
        """The read's figures in the step's report; ``on_driver``: the changes (if any) were
        applied on the driver and no vnode started, so without chunk rows no Spark job ran."""
        report.snapshot_rows = self.read
        if on_driver and self.rows is None and self.written is None:
            report.engine = "driver"
        if self.scanned is not None:
            report.extra["snapshot_rows_scanned"] = self.scanned
        if self.window_rows:
            report.extra["snapshot_window_rows"] = self.window_rows
        if self.engine is not None:
            report.extra["bulk_engine"] = self.engine


def snapshot_chunk(ctx: SourceContext, source: ChunkSource, state: BackfillState, plan: StepPlan,
                   d: MVDefinition, mv: storage.TableVersion | None = None) -> Chunk:
    """Chunked modes: the next chunk after each unfinished vnode's position, read from only
    the files that can hold it (the rows never pass through the driver); per-vnode stats (rows
    read, last key) come back to the driver. no_shuffle's shared limit is cut from the
    candidates' key columns (Arrow path) or from the read tasks' candidates in Spark
    (`first_rows`). ``mv``: write the chunk into it in Arrow when the
    source can (`arrow_seek_chunk`), else project in Spark."""
    readers = [p.vnode for p in plan.vnodes if p.read_table_version]
    if not readers or plan.chunk_limit == 0:
        return Chunk(None, 0, {})
    positions = {v: position(state.current(v)) for v in readers}
    engine = None
    first, ctx.first_written = ctx.first_written, None
    if first is not None:  # the replica's copy wrote the chunk of vnodes it just copied
        copied, written = first
        if mv is not None and set(readers) <= copied \
                and all(p is None for p in positions.values()):
            chunk = _written_chunk(written, readers, 0)  # no file read for it: 0 scanned
            chunk.engine = "arrow: written by the replica's copy"
            return chunk
        written.discard()
    if mv is not None and source.writes_chunks:
        chunk, engine = _in_arrow(
            lambda: arrow_seek_chunk(ctx, source, positions, state, plan, d, mv))
        if chunk is not None:
            return chunk
    rows, scanned = source.chunk(ctx, positions, state.key_order, plan.chunk_limit,
                                 plan.shared_read)
    candidates = rows.cache() if plan.shared_read else None
    if candidates is not None:
        rows = first_rows(candidates, state.key_order, plan.chunk_limit)
    chunk = project(rows, d).cache()
    try:
        stats = chunk_stats(chunk, state.key_order.names)
        if stats.bad_keys:
            refuse_flagged_chunk_key(chunk, BAD_KEY, state.key_order.names,
                                     ctx.tables.upstream, ctx.v_new)
    except Exception:
        chunk.unpersist()
        raise
    finally:
        if candidates is not None:
            candidates.unpersist()
    # no file boundary on this path: a chunk short of the limit is the vnode's whole rest
    per_vnode = {v: VnodeChunk(*stats.per_vnode.get(v, (0, None)),
                               exhausted=stats.per_vnode.get(v, (0,))[0] < plan.chunk_limit)
                 for v in readers}
    read = sum(n for n, _ in stats.per_vnode.values())
    if not read:
        chunk.unpersist()
        return Chunk(None, 0, per_vnode, scanned, engine=engine)
    return Chunk(chunk, read, per_vnode, scanned, engine=engine)


def arrow_seek_chunk(ctx: SourceContext, source: ChunkSource, positions: dict,
                     state: BackfillState, plan: StepPlan, d: MVDefinition,
                     mv: storage.TableVersion) -> Chunk | None:
    """The first phase of a chunked step's commit: the chunk read, projected in Arrow and
    written into ``mv`` by Python tasks that report each vnode's rows and last key. None
    when the definition does not compile to Arrow, or when a pk is null or repeated (the
    files are discarded; the Spark path then names the key)."""
    out = source.write_chunk(ctx, positions, state.key_order, plan.chunk_limit, d, mv,
                             plan.chunk_tail, plan.shared_read)
    if out is None:
        return None
    written, read = out
    if written.bad_keys:
        written.discard()
        return None
    chunk = _written_chunk(written, list(positions), read.scanned)
    chunk.window_rows = read.window_rows
    return chunk


def _in_arrow(write) -> tuple[Chunk | None, str | None]:
    """The chunk written by Python tasks (None: not possible here), or why Spark writes it
    instead (a value the Arrow transform refused: nothing was left written)."""
    try:
        return write(), None
    except storage.TransformRefused as refused:
        return None, f"spark: {refused}"


def _written_chunk(written: storage.BulkWritten, readers: list[int],
                   scanned: int | None) -> Chunk:
    """A chunk whose files Python tasks wrote (not committed yet), with its stats. A vnode
    that got no row has none left: a read leaving rows behind returns at least one."""
    per_vnode = {}
    for v in readers:
        rows, last, _ = written.vnode_stats.get(v, (0, None, False))
        per_vnode[v] = VnodeChunk(rows, last, exhausted=v in written.exhausted or not rows)
    read = sum(c.rows for c in per_vnode.values())
    if not read:
        written.discard()
        return Chunk(None, 0, per_vnode, scanned, engine="arrow")
    return Chunk(None, read, per_vnode, scanned, written=written, engine="arrow")


def first_chunk(ctx: SourceContext, source: SnapshotSource, d: MVDefinition, plan: StepPlan,
                mv: storage.TableVersion | None, fresh: list[int]) -> storage.FirstChunk | None:
    """What a replica's copy may write of this step's chunk: every reading vnode starts now
    (its chunk is the first rows of the copy) and the definition compiles to Arrow."""
    readers = plan.snapshot_vnodes
    if mv is None or not source.writes_chunks or plan.shared_read \
            or not readers or plan.chunk_limit == 0 or not set(readers) <= set(fresh):
        return None
    projection = exact_projection(ctx.spark, d, ctx.upstream_schema)
    if projection is None:
        return None
    return storage.FirstChunk(plan.chunk_limit, projection.project, NotExact, mv.uri,
                              mv.storage_options, mv.arrow_schema, mv_file_rows(ctx),
                              plan.chunk_tail)


def bulk_chunk(ctx: SourceContext, source: WholeSource, state: BackfillState, plan: StepPlan,
               d: MVDefinition, mv: storage.TableVersion | None = None) -> Chunk:
    """Snapshot mode: every remaining row of each unfinished vnode (no sort, not cached).
    ``mv``: the MV to write into when the step has nothing but these rows to commit; vnodes
    read whole are then written by Python tasks alone (`arrow_chunk`) when the definition
    compiles to Arrow, else projected in Spark."""
    readers = plan.snapshot_vnodes
    if not readers or plan.chunk_limit == 0:
        return Chunk(None, 0, {})
    unique = keys_kept_unique(ctx.tables.upstream, ctx.v_new, ctx.key_names, ctx.vnode_count,
                              ctx.tables.storage_options)
    positions = {v: position(state.current(v)) for v in readers}
    keys, _ = source.read(ctx, readers, key_only=True)
    engine = None
    if mv is not None and all(p is None for p in positions.values()):
        chunk, engine = _in_arrow(lambda: arrow_chunk(ctx, source, state, d, mv, readers, keys))
        if chunk is not None:
            return chunk
    rows, clustered = source.read(ctx, readers)
    rows, stats = read_remainder(rows, keys, positions, state.key_order, unique_keys=unique,
                                 uri=ctx.tables.upstream, version=ctx.v_new,
                                 key_stats=source.key_stats(ctx, positions, state.key_order,
                                                           unique))
    per_vnode = {v: VnodeChunk(*stats.get(v, (0, None)), exhausted=True) for v in readers}
    read = sum(c.rows for c in per_vnode.values())
    if not read:
        return Chunk(None, 0, per_vnode, engine=engine)
    return Chunk(project(rows, d), read, per_vnode, clustered=clustered, engine=engine)


def arrow_chunk(ctx: SourceContext, source: WholeSource, state: BackfillState, d: MVDefinition,
                mv: storage.TableVersion, readers: list[int], keys: DataFrame) -> Chunk | None:
    """The first phase of a bulk step's commit: the vnodes' rows read, projected in Arrow
    and written into ``mv`` by Python tasks, which report each vnode's rows and last key
    (the step commits the files with the progress they make). None when the upstream or
    the definition does not allow it; TransformRefused (nothing written) when a value is
    not proven exact in Arrow. A null or repeated pk discards the files and is refused by
    name, as on the Spark path."""
    bulk = source.arrow_rows(ctx, readers, d, state.key_order)
    if bulk is None:
        return None
    written = storage.write_bulk(ctx.spark, bulk, mv.uri, mv.storage_options, mv.arrow_schema,
                                 max_rows_per_file=mv_file_rows(ctx))
    if written.bad_keys:
        written.discard()
        check_snapshot_keys(keys, ctx.key_names, ctx.tables.upstream, ctx.v_new)  # raises
        raise AssertionError("the bulk tasks flagged a pk the key check did not find")
    per_vnode = {v: VnodeChunk(*written.vnode_stats.get(v, (0, None, False))[:2], exhausted=True)
                 for v in readers}
    return Chunk(None, sum(c.rows for c in per_vnode.values()), per_vnode, written=written,
                 engine="arrow")


def check_fresh_keys(ctx: SourceContext, vnodes: list[int]) -> None:
    """Vnodes starting now: no null or duplicate pk in their snapshot (one Spark pass, once
    per vnode, before their replica or MV rows are written). Skipped when every row of the
    upstream came from the platform's pk-enforcing writer (`keys_kept_unique`, as the bulk
    read does): the pass reads the whole upstream."""
    if not vnodes or keys_kept_unique(ctx.tables.upstream, ctx.v_new, ctx.key_names,
                                      ctx.vnode_count, ctx.tables.storage_options):
        return
    check_snapshot_keys(upstream_at(ctx).where(owned_tables.vnode_in(vnodes)), ctx.key_names,
                        ctx.tables.upstream, ctx.v_new)


def mv_file_rows(ctx: SourceContext) -> int:
    """Rows per MV data file: sized by the upstream version's rows (the MV holds at most
    those), so a bulk written in slices gets the files the whole table wants."""
    snap = storage.TableVersion.load(ctx.tables.upstream, ctx.v_new, ctx.tables.storage_options)
    return storage.file_rows_for(snap.live_rows)


def upstream_at(ctx: SourceContext) -> DataFrame:
    """The upstream's rows at the step's version, with the MV's vnode (lazy)."""
    rows = storage.read_version(ctx.spark, ctx.tables.upstream, ctx.v_new, ctx.upstream_schema,
                                  storage_options=ctx.tables.storage_options)
    return netting.with_vnode(rows, ctx.key_names, ctx.key_types, ctx.vnode_count)


def position(progress) -> tuple | None:
    return progress.current_pos if isinstance(progress, InProgress) else None
