"""The independent oracle of an aggregate MV: Spark's own GROUP BY over the upstream at the
version the MV's progress records (during an arrangement backfill: over the rows each
upstream vnode's position covers), compared with the MV row for row, value and type.

It shares nothing with the barrier's path but the definition's text: the upstream is read
with deltalake (not the storage layer's reader), the whole query is Spark SQL
(``SELECT group_by, aggregates FROM (filter, computed) GROUP BY group_by``: Spark's types,
roundings and null rules by construction), the group's vnode is the plain-Python hash, and the
MV is read back with deltalake. Values are compared exactly, but for sums and averages over
floating-point input, whose Spark value depends on the order Spark adds them in: those agree
within the bound docs/AGGREGATES.md gives ((n - 1) * 2^-53 * sum |v|, taken here as a relative
1e-9 of the larger value, far above it for any group below a million rows).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets.arrow.types import type_name
from backfill_assets.core.aggregate_definition import FLOATS, canonical_type
from backfill_assets.core.aggregates import group_vnode
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import INTERNAL_PREFIX, VNODE
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.core.vnode import vnode_of
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.modes import mode_named
from backfill_assets.step.preflight import CheckedUpstream, checked_upstream
from backfill_assets.storage import spark_schema
from backfill_assets.verify.oracle import Verdict, VnodeVerdict

RELATIVE = 1e-9


def aggregate_query(d: MVDefinition, view: str) -> str:
    """The Spark SQL the aggregate MV equals, over the upstream registered as ``view``."""
    computed = "".join(f", {c.expr} AS `{c.name}`" for c in d.computed)
    where = f" WHERE {d.filter}" if d.filter else ""
    inner = f"SELECT *{computed} FROM {view}{where}"
    groups = [f"{g.expr} AS `{g.name}`" for g in d.group_by]
    aggs = [f"{a.text} AS `{a.name}`" for a in d.aggregates]
    ordinals = ", ".join(str(i + 1) for i in range(len(groups)))
    return f"SELECT {', '.join(groups + aggs)} FROM ({inner}) GROUP BY {ordinals}"


def expected_groups(spark: SparkSession, d: MVDefinition, tables: MVTables,
                    version: int, covered: CheckedUpstream | None = None,
                    progress: Mapping[int, tuple] | None = None) -> pa.Table:
    """Spark's GROUP BY of the upstream at ``version`` (read with deltalake); with
    ``progress`` (an arrangement backfill's positions), over the rows they cover only: a key
    of a finished vnode, or at or below its vnode's position (the plain-Python vnode hash)."""
    upstream = owned_tables.open_if_exists(tables.upstream, tables.storage_options, version)
    rows = owned_tables.read_rows(upstream)
    rows = rows.drop_columns([c for c in rows.column_names if c == VNODE])
    if covered is not None and progress is not None:
        rows = rows.filter(pa.array(_covered(rows, d, covered, progress), pa.bool_()))
    view = f"{INTERNAL_PREFIX}oracle_upstream"
    spark.createDataFrame(rows, schema=spark_schema(rows.schema)).createOrReplaceTempView(view)
    return spark.sql(aggregate_query(d, view)).toArrow()


def _covered(rows: pa.Table, d: MVDefinition, up: CheckedUpstream,
             progress: Mapping[int, tuple]) -> list[bool]:
    order = up.key_order
    out = []
    for key in zip(*(rows.column(n).to_pylist() for n in order.names), strict=True):
        p = progress.get(vnode_of(key, up.key_types, d.vnode_count), (None,))[0]
        out.append(isinstance(p, Completed) or (
            isinstance(p, InProgress) and order.compare(key, p.current_pos) <= 0))
    return out


def verify_aggregate(spark: SparkSession, d: MVDefinition, tables: MVTables,
                     vnodes: Sequence[int] | None = None) -> Verdict:
    """The MV's groups of ``vnodes`` (group-key vnodes; all by default) against Spark's GROUP BY
    at the version every upstream vnode's progress records (nothing expected before the
    first barrier)."""
    vnodes = list(range(d.vnode_count)) if vnodes is None else list(vnodes)
    upstream = checked_upstream(tables, d, None)
    so = tables.storage_options
    progress_table = owned_tables.open_if_exists(tables.progress, so)
    progress = read_progress(progress_table, upstream.key_order, range(d.vnode_count)) \
        if progress_table else {}
    versions = {v for _, v in progress.values()}
    mv = owned_tables.open_if_exists(tables.mv, so)
    actual_rows = owned_tables.read_rows(mv) if mv is not None else None
    verdict = Verdict()
    expected_rows = None
    partial = not mode_named(d.mode).bulk and progress and not all(
        isinstance(p, Completed) for p, _ in progress.values())
    if len(versions) == 1 and (len(progress) == d.vnode_count or partial):
        version = versions.pop()
        expected_rows = expected_groups(spark, d, tables, version,
                                        upstream if partial else None, progress)
    elif progress:
        verdict.type_problems.append(f"upstream vnodes at different versions: {versions}")
    outputs = [*(g.name for g in d.group_by), *(a.name for a in d.aggregates)]
    if expected_rows is not None and actual_rows is not None:
        verdict.type_problems += _type_problems(expected_rows.schema, actual_rows.schema, outputs)
    floats = _float_outputs(d, expected_rows)
    expected = _by_vnode(expected_rows, d, outputs, floats, with_vnode=True)
    actual = _by_vnode(actual_rows, d, outputs, floats, with_vnode=False)
    for vnode in vnodes:
        exp, act = expected[vnode], actual[vnode]
        verdict.vnodes.append(VnodeVerdict(
            vnode, next(iter({v for _, v in progress.values()}), None), sum(exp.values()),
            sum(act.values()), sum((exp - act).values()), sum((act - exp).values())))
    return verdict


def _type_problems(expected: pa.Schema, actual: pa.Schema, outputs: list[str]) -> list[str]:
    have = {f.name: f.type for f in actual}
    problems = [f"{c}: MV has {have.get(c)}, Spark's GROUP BY gives {expected.field(c).type}"
                for c in outputs if have.get(c) != expected.field(c).type]
    if have.get(VNODE) != pa.int32():
        problems.append(f"{VNODE}: MV has {have.get(VNODE)}, expected int32")
    return problems


def _float_outputs(d: MVDefinition, expected: pa.Table | None) -> set[str]:
    """Aggregates whose value Spark adds in floating point from floating-point input."""
    if expected is None:
        return set()
    return {a.name for a in d.aggregates if a.function in ("sum", "avg")
            and canonical_type(str(expected.schema.field(a.name).type)) in FLOATS}


def _by_vnode(rows: pa.Table | None, d: MVDefinition, outputs: list[str], floats: set[str],
              with_vnode: bool) -> dict[int, Counter]:
    """Rows per group vnode as a multiset of comparable tuples (floats of ``floats``
    rounded to the oracle's tolerance)."""
    out: dict[int, Counter] = defaultdict(Counter)
    if rows is None:
        return out
    names = [g.name for g in d.group_by]
    types = [type_name(rows.schema.field(n).type) for n in names]
    for row in rows.to_pylist():
        vnode = group_vnode(tuple(row[n] for n in names), types, d.vnode_count) \
            if with_vnode else row[VNODE]
        out[vnode][tuple((c, _comparable(row[c], c in floats)) for c in outputs)] += 1
    return out


def _comparable(value: object, approximate: bool) -> str:
    """-0.0 and 0.0 are one value: Spark's min/max keep whichever of the two its scan meets
    first, so neither side may be told apart by the sign of a zero."""
    if isinstance(value, float) and value == 0:
        return repr(0.0)
    if approximate and isinstance(value, float) and math.isfinite(value) and value != 0:
        digits = -int(math.floor(math.log10(abs(value)))) + int(-math.log10(RELATIVE))
        return repr(round(value, digits))
    return repr(value)
