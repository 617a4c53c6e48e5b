"""What a join MV makes of its signed joined rows: a row MV's rows (the row MV's projection:
filter, computed, columns, keyed by the fact's pk), or an aggregate's input rows.

Why the row MV's projection: a joined column reads like an upstream column everywhere
(docs/JOINS.md), so the joined row is an upstream row to the projection, and a row means the
same on the driver (`engine.projection.project_rows`) as in Spark.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from backfill_assets.aggregate.projection import Projection, projection_of, signed_rows
from backfill_assets.aggregate.store import (
    INPUT,
    STATE,
    AggregateStore,
    group_texts,
    keyed_state,
    with_key,
)
from backfill_assets.aggregate.store import MV as AGG_MV
from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.arrow.join_state import JoinTables
from backfill_assets.arrow.types import type_name
from backfill_assets.core.aggregate_definition import GROUP_KEY
from backfill_assets.core.join_algebra import JoinPlan
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import VNODE
from backfill_assets.engine.projection import project_rows, validate_expressions
from backfill_assets.join.sources import Side
from backfill_assets.join.store import MV, JoinStore, Pair, held_by
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.preflight import CheckedUpstream
from backfill_assets.step.request import Hook


@dataclass(frozen=True)
class RowOutput:
    """A row join MV: ``rows`` is the definition the projection runs (no joins: its
    upstream is the joined rows, ``joined_schema`` with `vnode`)."""

    spark: SparkSession
    rows: MVDefinition
    joined_schema: pa.Schema
    store: JoinStore

    @property
    def phases(self) -> tuple[str, ...]:
        return (MV,)

    @property
    def mv_schema(self) -> pa.Schema:
        return self.store.mv_schema

    def ensure(self) -> None:
        t = self.store.table(MV)
        owned_tables.ensure_data_table(t.uri, t.schema, self.store.tables.storage_options,
                                       cdf=True, key_names=list(t.key),
                                       vnode_count=self.store.vnode_count)

    def held(self, phase: str) -> Pair | None:
        s = self.store
        return held_by(s.tables.mv, s.tables, s.name, phase, s.vnode_count, s.joins)

    def prepare(self, joined: pa.Table) -> None:
        """Nothing to compute before the MV's commit (its rows are read then)."""

    def _write_mv(self, joined: pa.Table, pair: Pair, hook: Hook) -> None:
        """The MV rows the joined changes touch, held -> after: a fact pk's +1 joined row
        projected (a row the filter rejects is deleted), a pk with only a -1 deleted."""
        jt, pk = self.store.jt, list(self.store.jt.plan.pk)
        snap = self.store.snapshot(MV)
        touched = joined.select(pk).group_by(pk, use_threads=False).aggregate([])
        before = self.store.read(snap, MV, touched)
        plus = _side(joined, 1, jt, self.joined_schema)
        _, after = project_rows(self.spark, self.rows, plus.slice(0, 0), plus,
                                self.joined_schema)
        self.store.write(MV, snap, before, after, pair, hook)

    def write(self, behind: list[str], joined: pa.Table, pair: Pair, hook: Hook) -> None:
        """The MV's commit, when it is ``behind``."""
        if MV in behind:
            self._write_mv(joined, pair, hook)
            hook(f"after_{MV}_commit")


@dataclass
class AggregateOutput:
    """An aggregate over the join: the signed joined rows are the aggregate's input rows
    (`aggregate.projection.signed_rows`), kept in the aggregate MV's own tables
    (`aggregate.store.AggregateStore`), each commit carrying the join's pair."""

    spark: SparkSession
    proj: Projection
    agg: AggregateStore
    store: JoinStore
    joined_schema: pa.Schema
    _changes: tuple[int, tuple[pa.Table, pa.Array]] | None = None

    @property
    def phases(self) -> tuple[str, ...]:
        return self.agg.phases

    @property
    def mv_schema(self) -> pa.Schema:
        return self.agg.table(AGG_MV).schema

    def ensure(self) -> None:
        self.agg.ensure()

    def held(self, phase: str) -> Pair | None:
        s = self.store
        return held_by(self.agg.table(phase).uri, s.tables, s.name, phase, s.vnode_count,
                       s.joins)

    def prepare(self, joined: pa.Table) -> None:
        """The signed input rows of ``joined`` and their groups (read no table: the barrier
        computes them while its state tables commit)."""
        self._signed(joined)

    def write(self, behind: list[str], joined: pa.Table, pair: Pair, hook: Hook) -> None:
        """The aggregate's tables ``behind`` brought forward side by side: each one's rows
        computed first (the MV's from the state and kept input after the barrier, computed
        or, for a table already there, read), then their commits in threads, as the
        aggregate barrier's (any subset a crash lets land is completed by recovery: each
        table holds the pair by its own app transactions)."""
        changes, keys = self._signed(joined)
        t, agg, jobs = self.proj.tables, self.agg, []
        if STATE in behind:
            snap, old = agg.read(STATE, keys)
            state = keyed_state(t, old, changes)
            jobs.append((STATE, snap, old, state))
        else:
            state = agg.read(STATE, keys)[1]
        kept = t.input_schema.empty_table()
        if INPUT in agg.phases:
            if INPUT in behind:
                snap, old = agg.read(INPUT, keys)
                kept = with_key(t.input_of(t.input_update(old, changes)[0]), t)
                jobs.append((INPUT, snap, old, kept))
            else:
                kept = agg.read(INPUT, keys)[1]
        if AGG_MV in behind:
            snap, old = agg.read(AGG_MV, keys)
            texts = state.column(GROUP_KEY) if GROUP_KEY in state.schema.names else None
            jobs.append((AGG_MV, snap, old, with_key(t.mv_rows(state, kept), t, texts)))

        def one(job: tuple[str, object, pa.Table, pa.Table]) -> None:
            phase, snap, old, new = job
            agg.write(phase, snap, old, new, pair.fact, range(self.store.vnode_count), hook,
                      extra=pair.txns(self.store.name, phase))
            hook(f"after_{phase}_commit")

        if len(jobs) < 2:
            for job in jobs:
                one(job)
            return
        with ThreadPoolExecutor(len(jobs), thread_name_prefix="join-agg-commit") as pool:
            list(pool.map(one, jobs))

    def _signed(self, joined: pa.Table) -> tuple[pa.Table, pa.Array]:
        """The joined rows as the aggregate's signed input rows and their groups' keys
        (computed once per barrier's joined rows)."""
        if self._changes is None or self._changes[0] != id(joined):
            jt = self.store.jt
            changes = signed_rows(self.spark, self.proj, _side(joined, -1, jt, self.joined_schema),
                                  _side(joined, 1, jt, self.joined_schema))
            self._changes = (id(joined), (changes, pc.unique(group_texts(changes,
                                                                          self.proj.tables))))
        return self._changes[1]


Output = RowOutput | AggregateOutput


def _side(joined: pa.Table, sign: int, jt: JoinTables, schema: pa.Schema) -> pa.Table:
    """The joined rows of one sign, with the fact pk's `vnode`, as ``schema``."""
    rows = joined.filter(pc.equal(joined.column(SIGN), sign)).drop_columns([SIGN])
    return jt.with_vnode(rows, list(jt.plan.pk)).select(schema.names).cast(schema)


def joined_schema(jt: JoinTables) -> pa.Schema:
    """The joined rows as an upstream to the projection: fact then carried columns, `vnode`
    (the fact pk's)."""
    return pa.schema([*(f for f in jt.joined_schema if f.name != SIGN),
                      pa.field(VNODE, pa.int32())])


def output_of(spark: SparkSession, d: MVDefinition, tables: MVTables,
              upstream: CheckedUpstream, sides: list[Side], joined: dict[str, str]) -> Output:
    """The join plan, its state tables and the MV's projection over the joined rows
    (Spark's analysis refuses an expression that does not resolve, by name)."""
    fact_types = {f.name: _type(f) for f in upstream.schema}
    pk = list(upstream.key_order.names)
    plan = JoinPlan.of(d.joins, pk, list(fact_types),
                       [[s.types[k] for k in s.join.key] for s in sides])
    jt = JoinTables(plan, fact_types, [s.types for s in sides], d.vnode_count)
    schema = joined_schema(jt)
    d.validate(fact_types, joined=joined)
    if d.is_aggregate:
        proj = projection_of(spark, d, schema, upstream.key_order)
        agg = AggregateStore(d.name, tables, proj.tables, d.vnode_count)
        store = JoinStore(d.name, tables, jt, agg.table(AGG_MV).schema, d.vnode_count)
        return AggregateOutput(spark, proj, agg, store, schema)
    rows = MVDefinition(d.name, d.upstream, d.primary_key, d.columns, d.filter, d.computed,
                        vnode_count=d.vnode_count)
    store = JoinStore(d.name, tables, jt, validate_expressions(spark, rows, schema),
                      d.vnode_count)
    return RowOutput(spark, rows, schema, store)


def _type(field: pa.Field) -> str:
    return type_name(field.type)
