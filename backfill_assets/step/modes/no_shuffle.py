"""No-shuffle mode: the upstream is already arranged by the MV's vnodes (a platform table or
another MV), so the snapshot is a time-travel read of the upstream version itself and nothing is
replicated; one position is shared by all the vnodes of a run (core/positions.py), so a run's
vnode range cannot be re-split while in progress (mv/run_layout.py fences it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

from backfill_assets import storage
from backfill_assets.core.errors import NoShuffleLayoutMismatch
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.positions import SharedPosition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook, Mode
from backfill_assets.step.seek_chunk import seek_chunk, write_seek_chunk
from backfill_assets.step.source_context import SeekRead, SourceContext
from backfill_assets.storage import arrow_schema


class UpstreamSource:
    """No-shuffle backfill: snapshot reads are time-travel reads of the upstream itself."""

    checks_keys = False  # the loop checks a fresh vnode's snapshot before its first chunk
    writes_chunks = True

    def prepare(self, ctx: SourceContext, replicate_from: Mapping[int, int | None],
                changes: DataFrame | pa.Table | None, hook: Hook) -> int:
        # the layout was checked before anything was written (step/preflight.py)
        hook("after_replica_commit")
        return 0

    def chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None], key_order: KeyOrder,
              limit: int, shared: bool) -> tuple[DataFrame, int]:
        return seek_chunk(ctx, ctx.tables.upstream, ctx.v_new, positions, key_order, limit,
                          shared)

    def write_chunk(self, ctx: SourceContext, positions: Mapping[int, Key | None],
                    key_order: KeyOrder, limit: int, d: MVDefinition, mv: storage.TableVersion,
                    tail: int = 0, shared: bool = False
                    ) -> tuple[storage.BulkWritten, SeekRead] | None:
        return write_seek_chunk(ctx, ctx.tables.upstream, ctx.v_new, positions, key_order,
                                limit, d, mv, tail, shared)


def check_layout(table, d: MVDefinition, key_order: KeyOrder,
                             tables: MVTables) -> None:
    """no_shuffle reads the upstream's vnode partitions directly: they must be ours (a platform
    upstream or an MV of the platform records its pk and vnode count in its configuration)."""
    config = table.metadata().configuration
    try:
        pk = [str(k) for k in json.loads(config[storage.PK_PROPERTY])]
        count = int(config[storage.VNODE_COUNT_PROPERTY])
    except (KeyError, TypeError, ValueError) as exc:
        raise NoShuffleLayoutMismatch(
            f"{tables.upstream} is not arranged by the platform's vnodes (no recorded primary "
            f"key and vnode count: {storage.PK_PROPERTY}, {storage.VNODE_COUNT_PROPERTY}"
            "); no_shuffle mode needs a platform upstream or another MV: use mode 'arrangement'"
        ) from exc
    if "vnode" not in arrow_schema(table).names:
        raise NoShuffleLayoutMismatch(
            f"{tables.upstream} has no vnode column; use mode 'arrangement'"
        )
    if count != d.vnode_count or tuple(pk) != key_order.names:
        raise NoShuffleLayoutMismatch(
            f"{tables.upstream} is arranged by {count} vnodes of {pk}, MV {d.name!r} by "
            f"{d.vnode_count} of {list(key_order.names)}; make them equal or use mode "
            "'arrangement'"
        )


NO_SHUFFLE = Mode("no_shuffle", SharedPosition, UpstreamSource(), check_upstream=check_layout)
