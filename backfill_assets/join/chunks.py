"""What an arrangement step of a join MV reads of the fact table: the next chunk of each
unfinished vnode above its position (or one chunk across them above a shared position), and
the change range's rows the positions already cover (the visibility rule).

Why these rows and no others: the join state holds exactly the fact rows at or below their
vnode's position (docs/JOINS.md, "Arrangement mode"), so a chunk's rows enter it as inserts
and a change enters only where the positions cover its key: every fact row exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.core.changes import is_visible
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.names import VNODE
from backfill_assets.core.positions import VnodeChunk
from backfill_assets.core.progress import BackfillState
from backfill_assets.core.vnode import vnodes_of
from backfill_assets.engine.netting import with_vnode

_RANK = "__backfill_chunk_rank"


@dataclass(frozen=True)
class FactReader:
    """The fact table as an arrangement step reads it: where, its key, the signed rows'
    ``schema`` (`SIGN`, then the columns the join reads)."""

    spark: SparkSession
    uri: str
    read_schema: pa.Schema  # the upstream's columns as stored (without `vnode`)
    schema: pa.Schema
    key_order: KeyOrder
    key_types: tuple[str, ...]
    vnode_count: int
    storage_options: Mapping[str, str]

    def visible(self, rows: pa.Table, state: BackfillState) -> pa.Table:
        """The signed change rows whose key the positions of ``state`` cover."""
        if rows.num_rows == 0:
            return rows
        names = self.key_order.names
        keys: list[Key] = list(zip(*(rows.column(n).to_pylist() for n in names), strict=True))
        by_key = dict(zip(keys, vnodes_of(keys, self.key_types, self.vnode_count), strict=True))
        progress = state.progress_map()
        mask = [is_visible(k, by_key.__getitem__, progress, self.key_order) for k in keys]
        return rows.filter(pa.array(mask, pa.bool_()))

    def chunk(self, state: BackfillState, version: int, limit: int, shared: bool
              ) -> tuple[pa.Table, dict[int, VnodeChunk]]:
        """The next chunk of every unfinished vnode above its position at ``version``, at
        most ``limit`` rows each (``shared``: ``limit`` in all, above the shared position),
        as +1 rows, and what each vnode read."""
        unfinished = state.unfinished_vnodes()
        if not unfinished or limit < 1:
            return self.schema.empty_table(), {}
        df = storage.read_version(self.spark, self.uri, version, self.read_schema,
                                  storage_options=self.storage_options)
        df = with_vnode(df, list(self.key_order.names), self.key_types, self.vnode_count)
        order = ", ".join(self.key_order.order_by_sql())
        if shared:
            pos = state.current(unfinished[0]).current_pos
            where = f"{VNODE} IN ({', '.join(map(str, unfinished))}) AND " \
                    f"({self.key_order.sql_after(pos)})"
            window = f"ORDER BY {order}"
        else:
            where = " OR ".join(
                f"({VNODE} = {v} AND ({self.key_order.sql_after(state.current(v).current_pos)}))"
                for v in unfinished)
            window = f"PARTITION BY {VNODE} ORDER BY {order}"
        ranked = df.where(where).selectExpr("*", f"row_number() OVER ({window}) AS {_RANK}")
        rows = ranked.where(f"{_RANK} <= {limit + 1}").toArrow().sort_by(_RANK)
        return self._split(rows, unfinished, limit, shared)

    def _split(self, rows: pa.Table, unfinished: Sequence[int], limit: int, shared: bool
               ) -> tuple[pa.Table, dict[int, VnodeChunk]]:
        """The rows read (at most ``limit + 1`` per window) as the chunk and each vnode's
        count, last key and whether it is exhausted."""
        kept = rows.filter(pc.less_equal(rows.column(_RANK), limit))
        names = self.key_order.names
        keys: list[Key] = list(zip(*(kept.column(n).to_pylist() for n in names), strict=True))
        vnodes = kept.column(VNODE).to_pylist()
        assert vnodes_of(keys, self.key_types, self.vnode_count) == vnodes, \
            "Spark's vnode hash and core.vnode disagree"
        all_vnodes = rows.column(VNODE).to_pylist()
        read: dict[int, VnodeChunk] = {}
        for v in unfinished:
            mine = [k for k, kv in zip(keys, vnodes, strict=True) if kv == v]
            exhausted = rows.num_rows <= limit if shared else all_vnodes.count(v) <= limit
            read[v] = VnodeChunk(len(mine), mine[-1] if mine else None, exhausted)
        columns = kept.select(self.schema.names[1:])
        signed = columns.add_column(0, SIGN, pa.array([1] * kept.num_rows, pa.int8()))
        return signed.cast(self.schema), read
