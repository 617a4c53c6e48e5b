"""Spark side of an MV step: projection, visibility, snapshot chunk selection.

Every function here builds a DataFrame from another; the SQL text of positions comes from the
pure core (`KeyOrder.sql_after_columns` / `sql_at_or_before_columns`, compared against a joined
table of positions), so Spark and the core agree on key order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException, ParseException, PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from backfill_assets.arrow.expressions import ArrowProjection, NotExact, compile_projection
from backfill_assets.core.errors import InvalidMVExpression
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import (
    BAD,
    BAD_KEY,
    EVERY,
    KEEP,
    OP,
    POSITION,
    POSITION_VNODE,
    ROW_NUMBER,
    TOP,
    VNODE,
)
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.core.snapshot import last_key_sort_sql
from backfill_assets.storage import LRU, col, spark_schema


def project(df: DataFrame, definition: MVDefinition) -> DataFrame:
    """Apply the MV definition: computed columns, the row filter as `KEEP`, output columns.

    Rows are not dropped here: a snapshot chunk must still advance the position over rows the
    filter rejects, and a forwarded upsert that the filter rejects becomes a delete.
    """
    keep = _kept(definition) if definition.filter else F.lit(True)
    extra = [F.col(c) for c in (OP, ROW_NUMBER, BAD_KEY) if c in df.columns]
    return df.select(*_mv_columns(definition), keep.alias(KEEP), *extra)


def _mv_columns(definition: MVDefinition) -> list:
    """The MV's columns (selected, computed, vnode) as Spark columns over upstream rows."""
    exprs = [col(c) for c in definition.columns]
    exprs += [F.expr(c.expr).alias(c.name) for c in definition.computed]
    return [*exprs, F.col(VNODE)]


def _kept(definition: MVDefinition):
    """The row filter, a null result counting as rejected (SQL's WHERE)."""
    return F.coalesce(F.expr(definition.filter), F.lit(False))


def project_rows(spark: SparkSession, definition: MVDefinition, before: pa.Table,
                 after: pa.Table, upstream_schema: pa.Schema | None = None
                 ) -> tuple[pa.Table, pa.Table]:
    """A small barrier's upstream rows (on the driver) as the MV rows they make, rows the filter
    rejects dropped. The filter and the computed columns run in one small Spark job over a
    local relation, so they mean exactly what they mean in the Spark path (`project`: every
    expression over every row, the filter's null a rejection); only their results come back
    (the row's index, `KEEP`, the computed values), and the selected columns are taken from
    the Arrow rows as they are, which is exact and halves what the job converts. A definition
    without a filter and computed columns only selects columns: no Spark job at all; one that
    compiles to Arrow with Spark's meaning (`exact_projection`, given ``upstream_schema``)
    needs none either, unless its rows hold a value it refuses (`NotExact`)."""
    if not definition.filter and not definition.computed:
        return selected_rows(definition, before), selected_rows(definition, after)
    after = after.select(before.column_names).cast(before.schema)
    exact = exact_projection(spark, definition, upstream_schema) \
        if upstream_schema is not None else None
    if exact is not None:
        try:  # the same values as the Spark job below, without one (arrow/expressions.py)
            return exact.project(before), exact.project(after)
        except NotExact:
            pass
    rows = pa.concat_tables([before, after])
    side = np.arange(rows.num_rows) < before.num_rows
    indexed = rows.append_column(ROW_NUMBER, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    df = spark.createDataFrame(indexed, schema=spark_schema(indexed.schema))
    out = df.select(*_evaluated(spark, definition)).toArrow()
    if not pc.all(pc.equal(out.column(ROW_NUMBER), indexed.column(ROW_NUMBER))).as_py():
        out = out.take(pc.sort_indices(out, sort_keys=[(ROW_NUMBER, "ascending")]))
    mv = rows.select(list(definition.columns))
    for c in definition.computed:
        mv = mv.append_column(out.schema.field(c.name), out.column(c.name))
    mv = mv.append_column(rows.schema.field(VNODE), rows.column(VNODE))
    kept = out.column(KEEP).to_numpy(zero_copy_only=False)
    return mv.filter(pa.array(kept & side)), mv.filter(pa.array(kept & ~side))


_EVALUATED: LRU[tuple, list] = LRU(64, name="projection columns")


def _evaluated(spark: SparkSession, definition: MVDefinition) -> list:
    """The row index, `KEEP` and the computed columns as Spark columns, built once per session
    and definition (each build is a few dozen JVM calls a warm loop would pay per barrier)."""
    key = (id(spark), repr(definition))
    columns = _EVALUATED.get(key)
    if columns is None:
        keep = _kept(definition) if definition.filter else F.lit(True)
        columns = [F.col(ROW_NUMBER), keep.alias(KEEP),
                   *[F.expr(c.expr).alias(c.name) for c in definition.computed]]
        _EVALUATED.put(key, columns)
    return columns


def selected_rows(definition: MVDefinition, rows: pa.Table) -> pa.Table:
    """The MV rows of upstream ``rows`` under a definition that only selects columns."""
    return rows.select([*definition.columns, VNODE])


_VALIDATED: LRU[tuple, pa.Schema] = LRU(64, name="validated MV schemas")


def validate_expressions(spark: SparkSession, definition: MVDefinition,
                         upstream_schema: pa.Schema,
                         recorded: pa.Schema | None = None) -> pa.Schema:
    """`_validate` once per process, definition and upstream schema: a warm loop of small
    barriers would otherwise pay a Spark analysis per barrier for the same answer.
    ``recorded``: the MV schema an earlier analysis of this definition over this schema gave
    (the progress table's pin): taken as the answer, so a step that needs no other Spark work
    never starts the session."""
    key = (repr(definition), upstream_schema.serialize().to_pybytes())
    schema = _VALIDATED.get(key)
    if schema is None:
        schema = recorded if recorded is not None else \
            _validate(spark, definition, upstream_schema)
        _VALIDATED.put(key, schema)
    return schema


_EXACT: LRU[tuple, ArrowProjection | None] = LRU(64, name="Arrow projections")


def exact_projection(spark: SparkSession, definition: MVDefinition,
                     upstream_schema: pa.Schema) -> ArrowProjection | None:
    """The definition compiled to Arrow kernels whose results are Spark's (`arrow.expressions`:
    a proven subset; its result types checked against Spark's own analysis), or None: then
    only Spark evaluates it. Built once per session, definition and upstream schema."""
    key = (id(spark), repr(definition), upstream_schema.serialize().to_pybytes())
    if key not in _EXACT:  # None is a result too (not exact: Spark projects)
        mv_schema = validate_expressions(spark, definition, upstream_schema)
        rows = upstream_schema if VNODE in upstream_schema.names else \
            upstream_schema.append(pa.field(VNODE, pa.int32()))  # the rows carry the MV's
        _EXACT.put(key, compile_projection(definition, rows, mv_schema))
    return _EXACT.get(key)


def _validate(spark: SparkSession, definition: MVDefinition,
              upstream_schema: pa.Schema) -> pa.Schema:
    """Parse and analyse each expression against the upstream schema; return the MV schema.

    Runs on an empty DataFrame of the upstream's exact types, so nothing is read or written.
    Selected columns keep the upstream's Arrow types exactly; computed columns get the Arrow
    type of Spark's result type.
    """
    fields = [f for f in upstream_schema if f.name != VNODE]
    empty = spark.createDataFrame([], spark_schema(pa.schema(fields)))
    empty = empty.withColumn(VNODE, F.lit(0).cast("int"))
    labelled = [("filter", definition.filter)] if definition.filter else []
    labelled += [(f"computed column {c.name!r}", c.expr) for c in definition.computed]
    for label, text in labelled:
        _check_expression(empty, definition.name, label, text)
    computed = _arrow_schema(project(empty, definition).drop(KEEP))
    by_name = {f.name: f for f in fields}
    out = [by_name[c] for c in definition.columns]
    out += [computed.field(c.name) for c in definition.computed]
    # all nullable: delta-rs merges validate an all-null row for unmatched deletes
    return pa.schema([*(f.with_nullable(True) for f in out), pa.field(VNODE, pa.int32())])


def _arrow_schema(df: DataFrame) -> pa.Schema:
    """The schema ``df.toArrow()`` gives, by analysis alone: pyspark casts what it collects to
    exactly this (``to_arrow_schema`` of the frame's schema, UTC timestamps, large types when
    the session asks for them), so no job runs, a noticeable share of a first barrier."""
    large = False
    if hasattr(df.sparkSession, "_jconf"):  # a classic session honours the setting; Connect not
        large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes",
                                         "false") == "true"
    return to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True,
                           timezone="UTC", prefers_large_types=large)


def _check_expression(empty: DataFrame, mv_name: str, label: str, text: str) -> None:
    """Refuse an expression that does not parse or resolve, naming it, with Spark's detail."""
    try:
        result = empty.select(F.expr(text)).schema[0].dataType  # analysis happens here
    except (AnalysisException, PySparkException) as exc:
        parsed = not isinstance(exc, ParseException)
        what = "does not work on the upstream's columns" if parsed else "does not parse"
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise InvalidMVExpression(
            f"MV {mv_name!r}: the {label} `{text}` {what}: {detail[:600]}; fix the expression "
            "in the MV definition (columns with spaces, dots or other special characters are "
            "written in backquotes: `my col`)"
        ) from exc
    if label == "filter" and not isinstance(result, T.BooleanType | T.NullType):
        raise InvalidMVExpression(
            f"MV {mv_name!r}: the filter `{text}` gives a {result.simpleString()}, not a "
            "boolean: write a condition (for example `qty > 2`)"
        )


def with_vnode_versions(df: DataFrame, versions: Mapping[int, int]) -> DataFrame:
    """Keep the change rows newer than their vnode's version (vnodes not listed are dropped)."""
    if not versions:
        return df.limit(0)
    case = " ".join(f"WHEN {v} THEN {ver}" for v, ver in sorted(versions.items()))
    return df.where(F.expr(f"_commit_version > (CASE vnode {case} ELSE NULL END)"))




def _with_positions(rows: DataFrame, every: Sequence[int], at: Mapping[int, Key],
                    key_order: KeyOrder, admits: str) -> DataFrame:
    """Keep the rows of `every` vnode and the rows of each `at` vnode that `admits` its position.

    The positions are a small table joined (broadcast) onto the rows by vnode, so the filter is
    one short comparison against columns: the literal alternative, one OR term per vnode,
    grows past Spark's code generation limit with many vnodes and is then interpreted row by
    row, many times slower. Literals come from the core, so key order is the core's.
    """
    nulls = [f"CAST(NULL AS {c.type})" for c in key_order.columns]
    values = [f"({v}, TRUE, {', '.join(nulls)})" for v in sorted(every)]
    for vnode, pos in sorted(at.items()):
        pos = key_order.normalize(pos)
        lits = [key_order.sql_literal(c, x) for c, x in zip(key_order.columns, pos, strict=True)]
        values.append(f"({vnode}, FALSE, {', '.join(lits)})")
    if not values:
        return rows.limit(0)
    names = [f"c{i}" for i in range(len(key_order.columns) + 2)]
    sql = f"SELECT * FROM VALUES {', '.join(values)} AS t({', '.join(names)})"
    table = rows.sparkSession.sql(sql)
    table = table.toDF(POSITION_VNODE, EVERY, *key_order.position_columns(POSITION))
    joined = rows.join(F.broadcast(table), F.col(VNODE) == F.col(POSITION_VNODE))
    kept = joined.where(F.col(EVERY) | F.expr(admits))
    return kept.drop(POSITION_VNODE, EVERY, *key_order.position_columns(POSITION))


def visible_rows(rows: DataFrame, progress: Mapping[int, object],
                 key_order: KeyOrder) -> DataFrame:
    """The change rows each vnode's backfill already covers (at or before its position)."""
    done = [v for v, p in progress.items() if isinstance(p, Completed)]
    at = {v: p.current_pos for v, p in progress.items() if isinstance(p, InProgress)}
    done += [v for v, pos in at.items() if key_order.is_placeholder(pos)]
    at = {v: pos for v, pos in at.items() if not key_order.is_placeholder(pos)}
    return _with_positions(rows, done, at, key_order, key_order.sql_at_or_before_columns(POSITION))


def rows_after(rows: DataFrame, positions: Mapping[int, Key | None],
               key_order: KeyOrder) -> DataFrame:
    """Snapshot rows not read yet: `key > current_pos` per vnode (all rows without a position,
    none of a finished vnode's placeholder)."""
    fresh = [v for v, pos in positions.items() if pos is None]
    at = {v: pos for v, pos in positions.items()
          if pos is not None and not key_order.is_placeholder(pos)}
    return _with_positions(rows, fresh, at, key_order, key_order.sql_after_columns(POSITION))


def select_chunk(rows: DataFrame, positions: Mapping[int, Key | None], key_order: KeyOrder,
                 limit: int, per_vnode: bool) -> DataFrame:
    """The next snapshot chunk: rows after the positions, in key order, at most `limit` rows
    per vnode (arrangement) or in total (no-shuffle's one shared position).

    Adds `ROW_NUMBER`, the row's rank inside its vnode, so the last row of each vnode is found
    without sorting again on the driver, and `_bad_key`, true for a null pk or a pk equal to the
    previous row's: the duplicate check rides on the window's sort instead of a `groupBy` of
    its own.
    """
    order = order_columns(key_order)
    pending = rows_after(rows, positions, key_order)
    if not per_vnode:
        pending = pending.orderBy(*order).limit(limit)
    window = Window.partitionBy("vnode").orderBy(*order)
    keys = [col(name) for name in key_order.names]
    same = reduce(lambda a, b: a & b, [k == F.lag(k).over(window) for k in keys])
    null = reduce(lambda a, b: a | b, [k.isNull() for k in keys])
    ranked = pending.withColumn(ROW_NUMBER, F.row_number().over(window))
    ranked = ranked.withColumn(BAD_KEY, F.coalesce(same, F.lit(False)) | null)
    return ranked.where(F.col(ROW_NUMBER) <= limit) if per_vnode else ranked


def first_rows(rows: DataFrame, key_order: KeyOrder, limit: int) -> DataFrame:
    """no_shuffle's shared read: the run's first ``limit`` rows in key order, out of the
    read tasks' candidates (each task kept its own first ``limit``). The cut is the
    ``limit``-th key, from a top-k of the keys (Spark keeps ``limit`` keys per partition and
    sorts nothing else); the filter keeps each task's partitioning and (vnode, key) order, so
    the rows still reach the writer clustered."""
    keys = [col(k) for k in key_order.names]
    top = rows.select(*keys).orderBy(*order_columns(key_order)).limit(limit)
    sort = F.struct(*[F.expr(e).alias(f"_o{i}")
                      for i, e in enumerate(last_key_sort_sql(key_order))])
    found = top.agg(F.count(F.lit(1)).alias("n"),
                    F.max_by(F.struct(*keys), sort).alias("last")).toArrow().to_pylist()[0]
    if found["n"] < limit:
        return rows  # fewer candidates than the limit: all of them
    cut = tuple(found["last"][k] for k in key_order.names)
    return rows.where(F.expr(key_order.sql_at_or_before(cut)))


@dataclass(frozen=True)
class ChunkStats:
    """Per vnode of a chunk: rows read and the last key in key order; and whether any row of
    the chunk has a bad key (null or repeated pk)."""

    per_vnode: dict[int, tuple[int, Key]]
    bad_keys: bool


def chunk_stats(chunk: DataFrame, key_names: Sequence[str]) -> ChunkStats:
    """One aggregate over the cached chunk: the row of highest `ROW_NUMBER` per vnode (only those
    rows reach the driver, as Arrow, so key values keep their exact types) and the bad-key flag."""
    top = chunk.groupBy("vnode").agg(F.max(ROW_NUMBER).alias(TOP),
                                     F.max(F.col(BAD_KEY).cast("int")).alias(BAD))
    keys = [col(k) for k in key_names]
    last = (chunk.join(top, "vnode").where(F.col(ROW_NUMBER) == F.col(TOP))
            .select("vnode", ROW_NUMBER, BAD, *keys).toArrow())
    rows = last.to_pylist()
    return ChunkStats({row["vnode"]: (row[ROW_NUMBER], tuple(row[k] for k in key_names))
                       for row in rows}, any(row[BAD] for row in rows))


def order_columns(key_order: KeyOrder) -> list:
    """Spark sort columns for the key order (direction and null placement per column)."""
    out = []
    for c in key_order.columns:
        ref = col(c.name)
        if c.descending:
            out.append(ref.desc_nulls_first() if c.nulls_first else ref.desc_nulls_last())
        else:
            out.append(ref.asc_nulls_first() if c.nulls_first else ref.asc_nulls_last())
    return out
