"""What the step loop hands a snapshot source, and what it asks of one (the Protocol every
mode's source implements): apart from the modes (step/modes/) so that the seek reads they
share can name it without importing them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from backfill_assets import storage
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.engine import netting as spark_ops
from backfill_assets.mv.tables import MVTables


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
        return spark_ops.with_vnode(df, self.key_names, self.key_types, self.vnode_count)


class SnapshotSource(Protocol):
    """Prepares and serves the rows a snapshot chunk is selected from."""

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | pa.Table | None, hook) -> int:
        """Bring the snapshot side of `replicate_from`'s vnodes to `ctx.v_new`; rows written."""

    def chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None], key_order: KeyOrder,
              limit: int, shared: bool) -> tuple[DataFrame, int]:
        """The next `limit` rows after each position (chunked modes), read by a seek; and
        the rows of the files read."""
