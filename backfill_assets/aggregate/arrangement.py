"""Arrangement (and no_shuffle) backfill of an aggregate MV (docs/AGGREGATES.md, "Modes"):
per-vnode positions over the upstream's vnodes, as the row MV's arrangement mode, feeding the
same group state, kept input and MV as the snapshot mode (aggregate/barrier.py).

Each barrier (a step) brings the MV from the aggregate of the rows every upstream vnode's
position covered at v_prev to the aggregate of the rows its new position covers at v_new:

1. the change feed (v_prev, v_new] netted per key, a key entering only when its vnode is
   finished or the key is at or below the vnode's position (`core.changes.is_visible`), as a
   -1 pre-image and a +1 post-image;
2. each unfinished vnode's next chunk of upstream rows above its position, read at v_new, as
   +1 rows (per vnode, `PerVnodePositions`; or one chunk across the vnodes above the shared
   position, `SharedPosition`: no_shuffle is the same code with the other strategy);
3. both through the snapshot mode's apply in one go, then the commits: state, kept input, MV,
   progress last with the new positions.

Why a step number, not the upstream version, in the app transactions: two steps may run at
the same upstream version (the upstream did not move while the chunks did), and recovery must
tell them apart. The step number is the progress table's own app transaction; the step's
v_new and chunk limit are written (`arrangement_step.json`) before its first commit, so a step
some table holds and the progress does not is redone for the tables behind it with the same
inputs, read at pinned versions: the same signed rows, never a row lost or counted twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.aggregate.barrier import _Barrier, apply_signed, open_barrier
from backfill_assets.aggregate.projection import signed_rows
from backfill_assets.core.changes import is_visible
from backfill_assets.core.errors import CorruptProgressRow
from backfill_assets.core.keys import Key
from backfill_assets.core.names import VNODE
from backfill_assets.core.positions import PerVnodePositions, SharedPosition, VnodeChunk
from backfill_assets.core.progress import BackfillState
from backfill_assets.core.vnode import vnodes_of
from backfill_assets.engine.netting import with_vnode
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import progress_rows, read_progress, refuse_stale, write_progress
from backfill_assets.step.request import Hook, StepReport

MODES = {"arrangement": PerVnodePositions, "no_shuffle": SharedPosition}
_RANK = "__backfill_chunk_rank"


def _plan_uri(tables: MVTables) -> str:
    return storage.objects.join(tables.aggregate_plan, "arrangement_step.json")


class _Steps:
    """The steps of one aggregate MV in arrangement or no_shuffle mode."""

    def __init__(self, b: _Barrier, strategy: PerVnodePositions | SharedPosition):
        self.b, self.strategy = b, strategy
        self.key_order = b.upstream.key_order

    def done_step(self) -> int:
        """The last step the progress table holds (0: none)."""
        found = owned_tables.txn_versions(self.b.progress, self.b.d.name, "progress",
                                          self.b.vnodes, self.b.tables.storage_options)
        values = [v for v in found.values() if v is not None]
        return min(values) if len(values) == len(found) else 0

    def state(self) -> tuple[BackfillState, int | None]:
        """The committed positions and the upstream version they were taken at."""
        rows = read_progress(self.b.progress, self.key_order, self.b.vnodes)
        versions = {v for _, v in rows.values()}
        if len(versions) > 1:
            raise CorruptProgressRow(
                f"the progress of aggregate MV {self.b.d.name!r} holds upstream versions "
                f"{sorted(versions)}: one step moves every vnode to one version; reset the MV")
        return BackfillState(self.key_order, self.b.vnodes, rows), \
            (versions.pop() if versions else None)

    def run(self, target: int, controls: Controls) -> StepReport:
        """Finish a step a crash left behind, then run one step to ``target``."""
        b, done = self.b, self.done_step()
        txns = b.txns()
        ahead = [v for v in txns.values() if v is not None and v > done]
        if ahead:
            plan = storage.read_json(_plan_uri(b.tables), b.tables.storage_options) or {}
            if plan.get("step") != max(ahead) or max(ahead) != done + 1:
                raise CorruptProgressRow(
                    f"aggregate MV {b.d.name!r}: tables hold step {max(ahead)} but the "
                    f"progress holds step {done} and the recorded step is {plan.get('step')}; "
                    "the tables were edited by hand: reset the MV")
            b.report.recovered = list(b.vnodes)
            done += 1
            self._step(done, plan["v_new"], plan["limit"], txns)
        state, at = self.state()
        if at is not None and target < at:
            refuse_stale(state, b.vnodes, target, b.tables.mv)
        if at is None or target > at or not state.is_finished():
            chunk_size = controls.chunk_size or b.d.chunk_size
            limit = self.strategy.chunk_limit(chunk_size, controls.rate_limit,
                                              len(state.unfinished_vnodes()))
            storage.write_json(_plan_uri(b.tables), {"step": done + 1, "v_new": target,
                                                     "limit": limit}, b.tables.storage_options)
            self._step(done + 1, target, limit, {})
        state, at = self.state()
        b.report.v_new = at if at is not None else target
        b.report.progress = {v: state.current(v) for v in b.vnodes}
        b.report.versions = {v: at for v in b.vnodes}
        b.report.extra.update(aggregate_path="arrangement", vnodes_finished=sum(
            1 for v in b.vnodes if state.current(v).finished), vnode_count=len(b.vnodes))
        return b.report

    def _step(self, step: int, v_new: int, limit: int, txns: Mapping[str, int | None]) -> None:
        """Step ``step``: the visible changes and the chunks as signed rows into the tables
        behind it (a table holding ``step`` already is skipped), then the progress."""
        b = self.b
        behind = [p for p in b.store.phases if txns.get(p) is None or txns[p] < step]
        state, v_prev = self.state()
        b.hook("before_write")
        before, after = self._changes(state, v_prev, v_new)
        chunk, read = self._chunk(state, v_new, limit)
        self.strategy.apply_chunk(state, read, limit)
        for v in b.vnodes:
            state.advance_version(v, v_new)
        after = pa.concat_tables([after, chunk])
        changes = signed_rows(b.spark, b.proj, before, after)
        b.report.snapshot_rows += chunk.num_rows
        b.report.forwarded_rows += before.num_rows + after.num_rows - chunk.num_rows
        b.report.extra["chunk_rows"] = chunk.num_rows
        apply_signed(b, step, behind, changes)
        b.hook("before_progress_commit")
        so = b.tables.storage_options
        write_progress(b.progress, state, self.key_order, b.d.name, b.vnodes, step, force=True,
                       storage_options=so,
                       rows=progress_rows(state, b.vnodes, v_new, self.key_order))
        b.hook("after_progress_commit")

    def _changes(self, state: BackfillState, v_prev: int | None, v_new: int
                 ) -> tuple[pa.Table, pa.Table]:
        """The netted change range's pre- and post-images of the keys the positions cover."""
        b = self.b
        schema = b.proj.upstream_schema
        if v_prev is None or v_new <= v_prev:
            return schema.empty_table(), schema.empty_table()
        netted = b.feed.netted(v_prev, v_new)
        return self._visible(netted.before, state), self._visible(netted.after, state)

    def _visible(self, rows: pa.Table, state: BackfillState) -> pa.Table:
        """The rows whose key the positions cover (the visibility rule)."""
        progress = state.progress_map()
        names = self.key_order.names
        keys = list(zip(*(rows.column(n).to_pylist() for n in names), strict=True))
        vnode_list = rows.column(VNODE).to_pylist()
        by_key = dict(zip(keys, vnode_list, strict=True))
        mask = [is_visible(k, by_key.__getitem__, progress, self.key_order) for k in keys]
        schema = self.b.proj.upstream_schema
        return rows.filter(pa.array(mask, pa.bool_())).select(schema.names).cast(schema)

    def _chunk(self, state: BackfillState, v_new: int, limit: int
               ) -> tuple[pa.Table, dict[int, VnodeChunk]]:
        """The next chunk of every unfinished vnode above its position at ``v_new`` (one
        chunk across them all above the shared position in no_shuffle), in key order."""
        b, schema = self.b, self.b.proj.upstream_schema
        unfinished = state.unfinished_vnodes()
        if not unfinished or limit < 1:
            return schema.empty_table(), {}
        df = storage.read_version(b.spark, b.tables.upstream, v_new,
                                  pa.schema([f for f in b.upstream.schema if f.name != VNODE]),
                                  storage_options=b.tables.storage_options)
        df = with_vnode(df, list(self.key_order.names), b.upstream.key_types, b.d.vnode_count)
        order = ", ".join(self.key_order.order_by_sql())
        if self.strategy.shared:
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
        rows = ranked.where(f"{_RANK} <= {limit + 1}").toArrow()
        rows = rows.sort_by(_RANK)
        return self._split(rows, unfinished, limit)

    def _split(self, rows: pa.Table, unfinished: list[int], limit: int
               ) -> tuple[pa.Table, dict[int, VnodeChunk]]:
        """The rows read (at most ``limit + 1`` per window) as the chunk and each vnode's
        count, last key and whether it is exhausted."""
        schema = self.b.proj.upstream_schema
        kept = rows.filter(pc.less_equal(rows.column(_RANK), limit))
        names = self.key_order.names
        keys: list[Key] = list(zip(*(kept.column(n).to_pylist() for n in names), strict=True))
        vnodes = kept.column(VNODE).to_pylist()
        check = vnodes_of(keys, self.b.upstream.key_types, self.b.d.vnode_count)
        assert check == vnodes, "Spark's vnode hash and core.vnode disagree"
        read: dict[int, VnodeChunk] = {}
        whole = rows.num_rows <= limit
        for v in unfinished:
            mine = [k for k, kv in zip(keys, vnodes, strict=True) if kv == v]
            rest = sum(1 for kv in rows.column(VNODE).to_pylist() if kv == v)
            exhausted = whole if self.strategy.shared else rest <= limit
            read[v] = VnodeChunk(len(mine), mine[-1] if mine else None, exhausted)
        return kept.select(schema.names).cast(schema), read


def run(spark: SparkSession, d, tables: MVTables, version: int | None, controls: Controls,
        hook: Hook) -> StepReport:
    """One step of the aggregate MV ``d`` in arrangement or no_shuffle mode."""
    started = time.monotonic()
    b, target = open_barrier(spark, d, tables, version, controls, hook)
    report = _Steps(b, MODES[d.mode]()).run(target, controls)
    report.seconds = time.monotonic() - started
    return report
