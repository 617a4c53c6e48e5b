"""What the step loop hands a snapshot source, and what it asks of one (the Protocol every
mode's source implements): apart from the modes (step/modes/) so that the seek reads they
share can name it without importing them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from backfill_assets import storage
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.engine import netting
from backfill_assets.mv.owned_tables import MVTables


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
    chunk_limit: int = 0  # the step's chunk limit (sizes the replica's files at creation)
    key_order: KeyOrder | None = None
    first_chunk: storage.FirstChunk | None = None  # the step's first chunk, for the copy
    first_written: tuple[frozenset[int], storage.BulkWritten] | None = None  # copy wrote it

    def with_vnode(self, df: DataFrame) -> DataFrame:
        """``df`` with the vnode recomputed from the pk with the MV's vnode count (the
        upstream's may differ)."""
        return netting.with_vnode(df, self.key_names, self.key_types, self.vnode_count)


@dataclass(frozen=True)
class SeekRead:
    """What a chunk's read decoded: the live rows of every file it read, and the rows it
    holds for the next barriers (a no_shuffle window, storage/chunks/cut_window.py; 0: none)."""

    scanned: int
    window_rows: int = 0


class SnapshotSource(Protocol):
    """Prepares and serves the rows a snapshot chunk is selected from."""

    # its reads check null and repeated pks themselves (the bulk read), so the loop does not
    # check the snapshot of vnodes that start now first
    checks_keys: bool
    # reads chunks by a seek (a `ChunkSource`), and can write one into the MV in Arrow; False:
    # reads vnodes whole (a `WholeSource`)
    writes_chunks: bool

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | pa.Table | None, hook: Callable[[str], None]) -> int:
        """Bring the snapshot side of `replicate_from`'s vnodes to `ctx.v_new`; rows written."""


class ChunkSource(SnapshotSource, Protocol):
    """The chunked modes' source: the next rows after each position, read by a seek."""

    def chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None], key_order: KeyOrder,
              limit: int, shared: bool) -> tuple[DataFrame, int]:
        """The next `limit` rows after each position, read by a seek; and the rows of the
        files read."""

    def write_chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None],
                    key_order: KeyOrder, limit: int, d: MVDefinition, mv: storage.TableVersion,
                    tail: int = 0, shared: bool = False
                    ) -> tuple[storage.BulkWritten, SeekRead] | None:
        """The same chunk projected in Arrow and written into ``mv`` by Python tasks (not
        committed), with what the read decoded; None when that is not possible here."""


class WholeSource(SnapshotSource, Protocol):
    """Snapshot mode's source: every remaining row of a vnode, read whole."""

    def read(self, ctx: SourceContext, vnodes: Sequence[int], *, key_only: bool = False
             ) -> tuple[DataFrame, bool]:
        """The vnodes' rows (``key_only``: pk and vnode columns) and whether each Spark
        partition holds one contiguous vnode range."""

    def arrow_rows(self, ctx: SourceContext, vnodes: Sequence[int], d: MVDefinition,
                   key_order: KeyOrder) -> storage.BulkRows | None:
        """The vnodes' whole rows for Python tasks to project; None: the Spark path."""

    def key_stats(self, ctx: SourceContext, positions: Mapping[int, Key | None],
                  key_order: KeyOrder, unique_keys: bool
                  ) -> dict[int, tuple[int, Key, bool]] | None:
        """Per vnode (rows after its position, last key, pk null or repeated), when known
        without the rows; None: computed from them."""
