"""A join MV's first barrier: the join at the pinned pair, its state tables and the MV (row
MV rows, or an aggregate's tables) from one read of each table.

Why not the barrier's own algebra: the first barrier is `apply` over empty state with every
row as +1 (docs/JOINS.md), which on the driver means collecting the whole fact table and
dimension. Two builds compute the same result where the rows are:

- by tasks here (join/bulk_tasks.py), where they serve (an aggregate without kept input
  whose projection compiles to Arrow, over a platform upstream, tasks on this machine): one
  read of the fact by Python tasks, no row through the JVM;
- by Spark (`BulkBuild._spark`) otherwise: the fact rows (the columns the MV reads) read once
  and cached in Spark, the dimension likewise; each index (the fact rows by join key, hashed
  to the join key's vnode: `join_state.index_schema`) and each dimension table written by
  Spark tasks through the storage door (`storage.apply_changes` inserts, one commit each,
  carrying the pair); the joined rows are Spark's equi-join (a null key matches nothing:
  SQL's rule, the algebra's), projected like the driver's rows (`engine.projection.project`,
  `aggregate.projection.bulk_values`). A row MV's rows are written by tasks too; an
  aggregate's groups are aggregated by Spark and only the groups come to the driver.

Only the tables behind the pair are written: a bulk barrier a crash interrupted resumes with
the tables it had not committed (each commit holds the pair: join/store.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.aggregate.projection import bulk_inputs, bulk_partials, bulk_values
from backfill_assets.core.errors import DimensionKeyNotUnique
from backfill_assets.core.names import INTERNAL_PREFIX, KEEP, VNODE
from backfill_assets.engine.netting import with_vnode
from backfill_assets.engine.projection import project
from backfill_assets.join.bulk_tasks import TaskBulk, refuse_duplicates, valid_keys, write_groups
from backfill_assets.join.output import AggregateOutput, Output
from backfill_assets.join.sources import Side
from backfill_assets.join.store import (
    MV,
    JoinStore,
    Pair,
    dimension_phase,
    index_phase,
)
from backfill_assets.mv import owned_tables
from backfill_assets.step.request import Hook

_KEY = f"{INTERNAL_PREFIX}dim_key_"
# fact rows per partition of the Spark join: at the session's 4 shuffle partitions a 20M-row
# join sorted 5M rows per task, whose pointer array asked the heap for 256 MB pages beside
# the cached facts, and a 2g driver ran out of heap (docs/JOINS.md, "Driver memory")
JOIN_PARTITION_ROWS = 1 << 20


@dataclass
class BulkBuild:
    """The first barrier of one join MV at ``to``: its inputs as Spark frames."""

    spark: SparkSession
    upstream_uri: str
    sides: list[Side]
    store: JoinStore
    out: Output
    to: Pair
    hook: Hook

    def run(self, behind: list[str], report_extra: dict) -> int:
        """Write every table in ``behind`` (state tables, then the MV's), in commit order;
        the number of fact rows read: by tasks here where they serve (join/bulk_tasks.py),
        else by Spark."""
        tasks = TaskBulk.of(self.spark, self.upstream_uri, self.sides, self.store, self.out,
                            self.to, self.hook)
        rows = tasks.run(behind, report_extra) if tasks is not None else None
        report_extra["bulk_path"] = "spark" if rows is None else "tasks"
        return self._spark(behind, report_extra) if rows is None else rows

    def _spark(self, behind: list[str], report_extra: dict) -> int:
        """The bulk by Spark: the fact's columns read and cached once, the state tables
        written by Spark tasks, the join and GROUP BY in Spark."""
        facts = self._facts().persist(StorageLevel.MEMORY_AND_DISK)
        dims = [self._dimension(i).persist(StorageLevel.MEMORY_AND_DISK)
                for i in range(self.store.joins)]
        seconds = report_extra.setdefault("bulk_seconds", {})
        try:
            started = time.perf_counter()
            rows = facts.count()  # materializes the cache: the fact table's one read
            seconds["read_facts"] = round(time.perf_counter() - started, 3)
            for i, d in enumerate(dims):
                _refuse_duplicate_keys(d, list(self.store.jt.plan.sides[i].key))
            seconds["read_dimensions"] = round(time.perf_counter() - started
                                               - seconds["read_facts"], 3)
            writes: dict[str, Callable[[], DataFrame]] = {}
            for i, side in enumerate(self.store.jt.plan.sides):
                writes[index_phase(i)] = lambda i=i, side=side: self._index(facts, i, side)
                writes[dimension_phase(i)] = lambda d=dims[i]: d
            for phase in self.store.phases:
                if phase in behind:
                    started = time.perf_counter()
                    self._append(phase, writes[phase](), rows)
                    self.hook(f"after_{phase}_commit")
                    seconds[phase] = round(time.perf_counter() - started, 3)
            out_behind = [p for p in self.out.phases if p in behind]
            if out_behind:
                started = time.perf_counter()
                joined = self._joined(facts, dims, rows)
                if isinstance(self.out, AggregateOutput):
                    report_extra["groups"] = self._aggregate(joined, out_behind)
                else:
                    self._rows(joined, rows)
                seconds["mv"] = round(time.perf_counter() - started, 3)
            return rows
        finally:
            facts.unpersist()
            for d in dims:
                d.unpersist()

    def _read(self, uri: str, version: int, schema: pa.Schema) -> DataFrame:
        return storage.read_version(self.spark, uri, version, schema,
                                    storage_options=self.store.tables.storage_options)

    def _facts(self) -> DataFrame:
        """The fact columns the MV reads (`JoinTables.fact_row_schema`), with the fact pk's
        vnode (the MV's)."""
        jt = self.store.jt
        pk = list(jt.plan.pk)
        return with_vnode(self._read(self.upstream_uri, self.to.fact, jt.fact_row_schema), pk,
                          [jt.fact_types[k] for k in pk], jt.vnode_count)

    def _dimension(self, i: int) -> DataFrame:
        """Dimension ``i``'s kept rows (a null key is matched by nothing: not kept), with its
        key's vnode."""
        jt, side = self.store.jt, self.sides[i]
        key = list(side.join.key)
        schema = pa.schema([f for f in jt.dimension_schemas[i] if f.name != VNODE])
        rows = self._read(side.uri, self.to.dimensions[i], schema)
        rows = rows.where(F.expr(" AND ".join(f"`{k}` IS NOT NULL" for k in key)))
        return with_vnode(rows, key, [jt.dim_types[i][k] for k in key], jt.vnode_count)

    def _index(self, facts: DataFrame, i: int, side) -> DataFrame:
        """Join ``i``'s index rows (`join_state.index_schema`): every fact with a non-null
        join key, its columns, by that key's vnode (hashed like the dimension key, so a key's
        index rows and dimension row meet)."""
        jt, on = self.store.jt, list(side.on)
        rows = facts.where(F.expr(" AND ".join(f"`{c}` IS NOT NULL" for c in on)))
        rows = rows.select(*(n for n in jt.index_schemas[i].names if n != VNODE))
        return with_vnode(rows, on, [jt.fact_types[c] for c in on], jt.vnode_count)

    def _append(self, phase: str, rows: DataFrame, rows_hint: int) -> None:
        """One commit of ``rows`` into the (empty) table of ``phase``, carrying the pair."""
        t, name, count = self.store.table(phase), self.store.name, self.store.vnode_count
        intent = owned_tables.intent(name, t.phase, range(count), self.to.fact,
                                     extra=self.to.txns(name, t.phase))
        rows = rows.select(*(storage.col(f.name).cast(storage.spark_type(f.type)).alias(f.name)
                             for f in t.schema))
        storage.apply_changes(self.spark, self.store.snapshot(phase), list(t.key), intent,
                              inserts=rows, rows_hint=rows_hint,
                              hook=lambda point: self.hook(f"{phase}_{point}"))

    def _joined(self, facts: DataFrame, dims: list[DataFrame], rows: int) -> DataFrame:
        """Each fact row with every join's carried columns, as `output.joined_schema`: a
        left join pads a missing dimension row with nulls, an inner join drops the row. Both
        sides hashed on the join key into partitions of ``JOIN_PARTITION_ROWS`` fact rows."""
        out, parts = facts, max(4, math.ceil(rows / JOIN_PARTITION_ROWS))
        for i, (side, d) in enumerate(zip(self.store.jt.plan.sides, dims, strict=True)):
            keys = [f"{_KEY}{i}_{j}" for j in range(len(side.key))]
            right = d.select(*(F.col(k).alias(a) for k, a in zip(side.key, keys, strict=True)),
                             *(F.col(c).alias(n) for n, c in side.columns))
            cond = [F.col(o) == F.col(a) for o, a in zip(side.on, keys, strict=True)]
            out, right = out.repartition(parts, *side.on), right.repartition(parts, *keys)
            out = out.join(right, on=cond, how="left" if side.kind == "left" else "inner") \
                .drop(*keys)
        schema = self.out.joined_schema
        return out.select(*(F.col(f.name).cast(storage.spark_type(f.type)).alias(f.name)
                            for f in schema))

    def _rows(self, joined: DataFrame, rows_hint: int) -> None:
        """A row MV: the joined rows through the row MV's projection, written by tasks."""
        kept = project(joined, self.out.rows).where(F.col(KEEP)).drop(KEEP)
        self._append(MV, kept, rows_hint)
        self.hook(f"after_{MV}_commit")

    def _aggregate(self, joined: DataFrame, behind: list[str]) -> int:
        """An aggregate over the join: Spark aggregates the groups (and collects the kept
        input when an aggregate keeps one), the driver writes the group tables."""
        out = self.out
        assert isinstance(out, AggregateOutput)
        t = out.proj.tables
        values = bulk_values(joined, out.proj)
        if t.kept:
            values = values.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            state = bulk_partials(values, out.proj)
            kept = bulk_inputs(values, out.proj) if t.kept else t.input_schema.empty_table()
        finally:
            if t.kept:
                values.unpersist()
        return write_groups(self.store, out, state, kept, self.to, self.hook, behind)


def refuse_duplicate_dimension_keys(spark: SparkSession, sides: list[Side], store: JoinStore
                                    ) -> None:
    """Every dimension's declared key unique at the pair's version: checked before the first
    barrier creates any table, so a refused MV leaves nothing behind, not even empty tables."""
    for side in sides:
        key = list(side.join.key)
        rows = storage.read_table(side.uri, side.version, key,
                                  storage_options=store.tables.storage_options)
        refuse_duplicates(rows.filter(valid_keys(rows, key)), key)


def _refuse_duplicate_keys(dimension: DataFrame, key: list[str]) -> None:
    """A declared key holding two rows would multiply the facts that reference it: refused
    before anything of the MV is written (as the barrier's algebra refuses it)."""
    if dimension.groupBy(*key).count().where(F.col("count") > 1).limit(1).count():
        raise DimensionKeyNotUnique(
            f"the dimension holds two rows for one value of its declared key {key}: declare "
            "the dimension's real key (unique, like a primary key)")
