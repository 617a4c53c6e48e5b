"""Upstream rows as an aggregate's signed input rows, with the row MV's own projection.

Why two stages of row-MV projection: an aggregate's group_by and arguments are evaluated after
its filter and computed columns and may name the computed columns, so stage one is the row
MV's projection (filter, computed: `engine.projection`, Arrow kernels where they are proven
to be Spark's, else one small Spark job), and stage two evaluates the group expressions and
the arguments over stage one's rows. Both stages are the same code on the driver (a barrier's
few changed rows, `signed_rows`) and in Spark (a bulk snapshot, `bulk_values`), so a row means
the same thing on either side. Spark's analysis of the two stages gives the types the
aggregate plan needs (`AggregatePlan.of`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets.arrow.aggregate_state import (
    ROWS,
    SIGN,
    AggregateTables,
    count_column,
    sum_column,
    value_column,
)
from backfill_assets.arrow.types import type_name
from backfill_assets.core.aggregates import AggregatePlan
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.mv_definition import ComputedColumn, MVDefinition
from backfill_assets.core.names import INTERNAL_PREFIX, KEEP, VNODE
from backfill_assets.engine.projection import project, project_rows, validate_expressions
from backfill_assets.storage import LRU


def group_column(i: int) -> str:
    """Stage two's name of group column i (a group may be named like an upstream column)."""
    return f"{INTERNAL_PREFIX}group_{i}"


@dataclass(frozen=True)
class Projection:
    """An aggregate MV's two projection stages, its plan and its tables' schemas."""

    rows: MVDefinition  # stage one: filter + computed over the upstream's columns
    values: MVDefinition  # stage two: group expressions and arguments over stage one's rows
    upstream_schema: pa.Schema  # the carried upstream columns + `vnode`
    rows_schema: pa.Schema  # stage one's output (+ `vnode`)
    values_schema: pa.Schema  # stage two's output (+ `vnode`)
    plan: AggregatePlan
    tables: AggregateTables

    @property
    def pk_names(self) -> list[str]:
        return list(self.values.columns)

    @property
    def reads_vnode(self) -> bool:
        """Whether an expression of either stage may read the upstream row's `vnode` (its
        text names it anywhere): only then does a change row need its key's hash."""
        texts = [self.rows.filter or "", *(c.expr for d in (self.rows, self.values)
                                           for c in d.computed)]
        return any(VNODE in t.lower() for t in texts)


_PROJECTIONS: LRU[tuple, Projection] = LRU(32, name="aggregate projections")


def projection_of(spark: SparkSession, d: MVDefinition, upstream: pa.Schema,
                  key_order: KeyOrder, recorded: Mapping[str, str] | None = None) -> Projection:
    """The definition's projection over the carried ``upstream`` columns, analysed by Spark
    once per process, definition and schema (`validate_expressions` refuses an expression
    that does not parse or resolve, by name; `AggregatePlan.of` a type it cannot keep).
    ``recorded``: the stages' schemas an earlier analysis gave (`recorded_schemas`), taken
    as the answer, so a barrier whose projection compiles to Arrow starts no JVM."""
    key = (repr(d), upstream.serialize().to_pybytes())
    known = _PROJECTIONS.get(key)
    if known is not None:
        return known
    fields = [f for f in upstream if f.name != VNODE]
    upstream = pa.schema([*fields, pa.field(VNODE, pa.int32())])
    rows = MVDefinition(d.name, d.upstream, d.primary_key, tuple(f.name for f in fields),
                        d.filter, d.computed, vnode_count=d.vnode_count)
    rows_schema = validate_expressions(spark, rows, upstream, _schema(recorded, "rows"))
    args = [(i, a) for i, a in enumerate(d.aggregates) if a.arg is not None]
    computed = [*(ComputedColumn(group_column(i), g.expr) for i, g in enumerate(d.group_by)),
                *(ComputedColumn(value_column(i), a.arg) for i, a in args)]
    values = MVDefinition(d.name, d.upstream, d.primary_key, tuple(key_order.names),
                          computed=tuple(computed), vnode_count=d.vnode_count)
    typed = validate_expressions(spark, values, rows_schema, _schema(recorded, "values"))
    types = {g.name: type_name(typed.field(group_column(i)).type)
             for i, g in enumerate(d.group_by)}
    types |= {a.name: type_name(typed.field(value_column(i)).type) for i, a in args}
    plan = AggregatePlan.of(d.group_by, d.aggregates, types)
    pk = [(c.name, c.type) for c in key_order.columns]
    out = Projection(rows, values, upstream, rows_schema, typed, plan,
                     AggregateTables(plan, pk, d.vnode_count))
    _PROJECTIONS.put(key, out)
    return out


def recorded_schemas(p: Projection) -> dict[str, str]:
    """The two stages' schemas as text, for `projection_of`'s ``recorded``."""
    return {name: base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")
            for name, schema in (("rows", p.rows_schema), ("values", p.values_schema))}


def _schema(recorded: Mapping[str, str] | None, name: str) -> pa.Schema | None:
    if not recorded or name not in recorded:
        return None
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(recorded[name])))


def signed_rows(spark: SparkSession, p: Projection, before: pa.Table, after: pa.Table
                ) -> pa.Table:
    """The changed keys' rows before (-1) and after (+1) a change range, upstream rows with
    their `vnode`, as the aggregate's typed change rows; a row the filter rejects does not
    enter, so a row crossing the filter is a retraction or an insertion alone."""
    b1, a1 = project_rows(spark, p.rows, before, after, p.upstream_schema)
    b2, a2 = project_rows(spark, p.values, b1, a1, p.rows_schema)
    parts = [_signed(t, sign, p) for t, sign in ((b2, -1), (a2, 1))]
    return p.tables.typed_changes(pa.concat_tables(parts))


def _signed(rows: pa.Table, sign: int, p: Projection) -> pa.Table:
    named = _named_groups(rows, p)
    return named.append_column(SIGN, pa.repeat(pa.scalar(sign, pa.int8()), rows.num_rows))


def _named_groups(rows: pa.Table, p: Projection) -> pa.Table:
    """Stage two's group columns under the MV's group names (other columns as they are)."""
    renames = {group_column(i): n for i, n in enumerate(p.plan.group_names)}
    return rows.rename_columns([renames.get(n, n) for n in rows.column_names])


def bulk_values(df: DataFrame, p: Projection) -> DataFrame:
    """Upstream rows (with `vnode`) in Spark as stage two's rows: pk, group columns (stage
    two's names), arguments, `vnode`; rows the filter rejects dropped."""
    rows = project(df, p.rows).where(F.col(KEEP)).drop(KEEP)
    return project(rows, p.values).drop(KEEP)


def bulk_partials(values: DataFrame, p: Projection) -> pa.Table:
    """Each group's state from stage two's rows, aggregated by Spark (one row per group):
    the row count, per argument its non-null count, per running sum its exact sum in
    decimal(38, input scale) (a sum beyond it fails in ANSI Spark, as the GROUP BY would)."""
    t = p.tables
    groups = [group_column(i) for i in range(len(p.plan.group_names))]
    aggs = [F.count(F.lit(1)).alias(ROWS)]
    aggs += [F.count(F.col(value_column(i))).alias(count_column(i)) for i in t.args]
    for i in t.running:
        wide = f"decimal(38,{p.plan.sum_scale(i)})"
        total = F.sum(F.col(value_column(i)).cast(wide))
        aggs.append(F.coalesce(total, F.lit(0).cast(wide)).alias(sum_column(i)))
    partials = values.groupBy(*groups).agg(*aggs).toArrow()
    return t.state_of(_named_groups(partials, p))


def bulk_inputs(values: DataFrame, p: Projection) -> pa.Table:
    """The kept input of every group from stage two's rows (empty when nothing is kept)."""
    t = p.tables
    if not t.kept:
        return t.input_schema.empty_table()
    groups = [group_column(i) for i in range(len(p.plan.group_names))]
    rows = values.select(*groups, *p.pk_names, *(value_column(i) for i in t.kept)).toArrow()
    return t.input_of(_named_groups(rows, p))

