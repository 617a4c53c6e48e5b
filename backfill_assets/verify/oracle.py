"""The independent oracle: recompute the MV from the upstream and compare row for row.

It shares no code path with the step: the upstream version each vnode records is read with
deltalake (not Spark's parquet reader), vnodes are computed by the plain-Python hash, positions
are applied with the core's Python key comparison, and only the MV definition's SQL (filter,
computed columns) is evaluated by Spark, on those rows. The MV is read back with deltalake.

Exact on types: selected columns are expected with the upstream's own Arrow type and values
as deltalake read them (they never pass through Spark here), and the MV's schema must match
(a timestamp without time zone that came back zoned, or a smallint widened to int, is a
failure, not an equal-looking value).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import ROW_ID, VNODE
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.core.vnode import vnode_of
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.storage import arrow_schema, spark_schema


@dataclass
class VnodeVerdict:
    vnode: int
    version: int | None
    expected: int
    actual: int
    missing: int
    unexpected: int

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0


@dataclass
class Verdict:
    vnodes: list[VnodeVerdict] = field(default_factory=list)
    type_problems: list[str] = field(default_factory=list)  # MV column types not as expected

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.vnodes) and not self.type_problems

    @property
    def rows_compared(self) -> int:
        return sum(v.expected for v in self.vnodes)

    def failures(self) -> list[VnodeVerdict]:
        return [v for v in self.vnodes if not v.ok]


def verify(spark: SparkSession, d: MVDefinition, tables: MVTables,
           vnodes: Sequence[int] | None = None, progress: dict | None = None,
           say: Callable[[str], None] = lambda _: None) -> Verdict:
    """Compare every vnode of the MV with f(upstream@v_k, key <= current_pos_k).

    `progress` (vnode -> (progress, version)) defaults to the progress table; the crash tests
    pass the progress a rerun would recover instead. `say` hears each stage as it ends (a
    verification of a large MV takes minutes: verify_job logs them).
    """
    vnodes = list(range(d.vnode_count)) if vnodes is None else list(vnodes)
    upstream = checked_upstream(tables, d, None)
    so = tables.storage_options
    if progress is None:
        progress_table = owned_tables.open_if_exists(tables.progress, so)
        progress = (read_progress(progress_table, upstream.key_order, vnodes)
                    if progress_table else {})
    mv = owned_tables.open_if_exists(tables.mv, so)
    verdict = Verdict()
    if mv is not None:
        verdict.type_problems = _type_problems(spark, d, upstream.schema, arrow_schema(mv))
    actual_rows = owned_tables.read_rows(mv, vnodes).to_pylist() if mv else []
    actual = defaultdict(Counter)
    for row in actual_rows:
        actual[row["vnode"]][_frozen(row)] += 1
    say(f"read the MV: {len(actual_rows)} rows of {len(vnodes)} vnodes")
    by_version = defaultdict(list)
    for vnode, (_, version) in progress.items():
        by_version[version].append(vnode)
    expected = defaultdict(Counter)
    for done, (version, group) in enumerate(by_version.items(), 1):
        for row in _expected_rows(spark, d, tables, upstream, version, group, progress):
            expected[row["vnode"]][_frozen(row)] += 1
        say(f"recomputed {len(group)} vnodes at upstream v{version} ({done}/{len(by_version)} "
            "versions)")
    for vnode in vnodes:
        exp, act = expected[vnode], actual[vnode]
        verdict.vnodes.append(VnodeVerdict(
            vnode, progress.get(vnode, (None, None))[1], sum(exp.values()), sum(act.values()),
            sum((exp - act).values()), sum((act - exp).values())))
    return verdict


def _expected_rows(spark, d: MVDefinition, tables: MVTables, upstream, version: int,
                   vnodes: list[int], progress: dict) -> list[dict]:
    """f(upstream@version restricted to `vnodes` and key <= each vnode's position)."""
    key_order = upstream.key_order
    table = owned_tables.open_if_exists(tables.upstream, tables.storage_options, version)
    names = [f.name for f in upstream.schema]
    rows = owned_tables.read_rows(table, None, names).to_pylist()
    wanted = set(vnodes)
    kept = []
    for row in rows:
        key = tuple(row[k] for k in key_order.names)
        vnode = vnode_of(key, upstream.key_types, d.vnode_count)
        if vnode not in wanted:
            continue
        p = progress[vnode][0]
        if isinstance(p, Completed) or (
            isinstance(p, InProgress) and key_order.compare(key, p.current_pos) <= 0
        ):
            kept.append({**row, "vnode": vnode})
    if not kept:
        return []
    return _apply_definition(spark, d, upstream.schema, kept)


def _apply_definition(spark, d: MVDefinition, schema: pa.Schema, rows: list[dict]) -> list[dict]:
    """MV rows of `rows`: Spark evaluates only the filter and the computed columns (on rows of
    the exact upstream types); selected columns are copied from `rows` as deltalake read them."""
    ids = pa.array(range(len(rows)), pa.int64())
    table = pa.Table.from_pylist(rows, schema=pa.schema([*schema, pa.field(VNODE, pa.int32())]))
    table = table.append_column(ROW_ID, ids)
    df = spark.createDataFrame(table, schema=spark_schema(table.schema))
    keep = F.coalesce(F.expr(d.filter), F.lit(False)) if d.filter else F.lit(True)
    computed = [F.expr(c.expr).alias(c.name) for c in d.computed]
    out = df.select(F.col(ROW_ID), *computed).where(keep).toArrow().to_pylist()
    return [{**{c: rows[r[ROW_ID]][c] for c in d.columns},
             **{c.name: r[c.name] for c in d.computed}, VNODE: rows[r[ROW_ID]][VNODE]}
            for r in out]


def _type_problems(spark, d: MVDefinition, upstream: pa.Schema, mv: pa.Schema) -> list[str]:
    """Each MV column whose type is not the upstream's (selected) or Spark's (computed)."""
    empty = spark.createDataFrame([], spark_schema(upstream))
    computed = empty.select(*[F.expr(c.expr).alias(c.name) for c in d.computed])
    want = {c: upstream.field(c).type for c in d.columns}
    want.update({f.name: f.type for f in computed.limit(0).toArrow().schema})
    want[VNODE] = pa.int32()
    have = {f.name: f.type for f in mv}
    problems = [f"{c}: MV has {have.get(c)}, expected {t}" for c, t in want.items()
                if have.get(c) != t]
    problems += [f"{c}: not an MV column" for c in have if c not in want]
    return problems


def _frozen(row: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))
