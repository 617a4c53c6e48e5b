"""The independent oracle of a join MV: the join recomputed by Spark SQL from both tables at
the version pair the MV's progress records, then the row MV's filter, computed columns and
columns (or the aggregate's GROUP BY), compared with the MV row for row (as multisets) and
column types against Spark's.

Why Spark SQL and not the join state: the MV is built by the Arrow join algebra from change
feeds; the oracle shares none of that code, only the definition (`join_sql` writes the
relation the MV equals, docs/JOINS.md). While an arrangement backfill is unfinished, the MV
is the join of the fact rows its positions cover: the recompute reads only those (a key of a
finished vnode, or at or below its vnode's position, by Spark's vnode hash)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from backfill_assets import storage
from backfill_assets.core.join_definition import join_sql
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import VNODE
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.engine.netting import with_vnode
from backfill_assets.join.sources import dimension_uri
from backfill_assets.join.store import Pair, recorded_pair
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.column_identity import used_columns
from backfill_assets.step.modes import mode_named
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.verify.aggregate_oracle import aggregate_query
from backfill_assets.verify.oracle import Verdict, VnodeVerdict

WHOLE_MV = -1  # the vnode a join MV's one comparison is reported under: it is compared whole


@dataclass(frozen=True)
class JoinVerdict:
    """Rows the MV lacks and rows it has too many of (first few), and how many compared."""

    pair: Pair | None
    rows_compared: int
    missing: list[dict]
    extra: list[dict]
    type_problems: list[str]
    missing_count: int = 0
    extra_count: int = 0
    actual_count: int = 0

    @property
    def ok(self) -> bool:
        return self.pair is not None and not (self.missing or self.extra
                                              or self.type_problems)

    def as_verdict(self) -> Verdict:
        """The verdict in the shape verify_job and the check report (one row, `WHOLE_MV`)."""
        version = self.pair.fact if self.pair is not None else None
        problems = self.type_problems or ([] if self.pair is not None else
                                          ["no barrier has run: nothing to compare"])
        return Verdict([VnodeVerdict(WHOLE_MV, version, self.rows_compared, self.actual_count,
                                     self.missing_count, self.extra_count)], list(problems))


def expected_rows(spark: SparkSession, d: MVDefinition, tables: MVTables, pair: Pair
                  ) -> DataFrame:
    """The MV's rows recomputed at ``pair``: join_sql over both tables' versions, then the
    row MV's projection in SQL (computed columns, WHERE filter, the columns), or the
    aggregate MV's GROUP BY (`aggregate_query`)."""
    so = tables.storage_options
    fact = _covered(storage.read_version(spark, tables.upstream, pair.fact,
                                         storage_options=so), d, tables)
    fact_view = f"__bf_fact_{d.name}"
    fact.createOrReplaceTempView(fact_view)
    views = {}
    for i, (j, v) in enumerate(zip(d.joins, pair.dimensions, strict=True)):
        view = f"__bf_dim_{d.name}_{i}"
        storage.read_version(spark, dimension_uri(tables, j.table), v,
                             storage_options=so).createOrReplaceTempView(view)
        views[j.table] = view
    facts = sorted(used_columns(d, [c for c in fact.columns if c != VNODE]))
    joined = spark.sql(join_sql(d.joins, fact_view, views, facts))
    if d.is_aggregate:  # the aggregate MV's own query, over the joined rows
        joined.createOrReplaceTempView(f"__bf_joined_{d.name}")
        return spark.sql(aggregate_query(d, f"__bf_joined_{d.name}"))
    selected = [f"`{c}`" for c in d.columns] + [f"{c.expr} AS `{c.name}`" for c in d.computed]
    if d.filter:
        joined = joined.where(f"coalesce({d.filter}, false)")
    return joined.selectExpr(*selected)


def _covered(fact: DataFrame, d: MVDefinition, tables: MVTables) -> DataFrame:
    """The fact rows an unfinished arrangement backfill's positions cover (all of them once
    every vnode is finished, or in snapshot mode)."""
    if mode_named(d.mode).bulk:
        return fact
    up = checked_upstream(tables, d, None, joins_served=True)
    table = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    progress = read_progress(table, up.key_order, range(d.vnode_count)) if table else {}
    if len(progress) == d.vnode_count and all(isinstance(p, Completed)
                                              for p, _ in progress.values()):
        return fact
    terms = [f"{VNODE} = {v}" if isinstance(p, Completed) else
             f"({VNODE} = {v} AND NOT ({up.key_order.sql_after(p.current_pos)}))"
             for v, (p, _) in sorted(progress.items()) if isinstance(p, Completed | InProgress)]
    covered = with_vnode(fact, list(up.key_order.names), up.key_types, d.vnode_count)
    return covered.where(" OR ".join(terms) or "FALSE")


def verify_join(spark: SparkSession, d: MVDefinition, tables: MVTables,
                show: int = 5) -> JoinVerdict:
    """The MV against the recompute at its recorded pair (a verdict that is not ok when no
    barrier has run)."""
    pair = recorded_pair(d.name, tables, len(d.joins), d.vnode_count)
    if pair is None:
        return JoinVerdict(None, 0, [], [], [])
    expected = expected_rows(spark, d, tables, pair)
    actual = spark.read.format("delta").load(tables.mv)
    type_problems = [f"{f.name}: MV {actual.schema[f.name].dataType.simpleString()}, "
                     f"Spark {f.dataType.simpleString()}" for f in expected.schema.fields
                     if actual.schema[f.name].dataType != f.dataType]
    actual = actual.selectExpr(*(f"CAST(`{f.name}` AS {f.dataType.simpleString()}) AS "
                                 f"`{f.name}`" for f in expected.schema.fields))
    lacking, surplus = expected.exceptAll(actual), actual.exceptAll(expected)
    missing = [r.asDict() for r in lacking.limit(show).collect()]
    extra = [r.asDict() for r in surplus.limit(show).collect()]
    return JoinVerdict(pair, expected.count(), missing, extra, type_problems,
                       lacking.count() if missing else 0, surplus.count() if extra else 0,
                       actual.count())
