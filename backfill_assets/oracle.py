"""The independent oracle: recompute the MV from the upstream and compare row for row.

It shares no code path with the step: the upstream version each vnode records is read with
deltalake (not Spark's parquet reader), vnodes are computed by the plain-Python hash, positions
are applied with the core's Python key comparison, and only the MV definition's SQL (filter,
computed columns) is evaluated by Spark, on those rows. The MV is read back with deltalake.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets import mv_store
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.core.vnode import vnode_of
from backfill_assets.mv_spark import KEEP, project
from backfill_assets.mv_store import MVTables
from backfill_assets.recovery import read_progress
from backfill_assets.spark_ops import spark_schema
from backfill_assets.upstream_check import checked_upstream


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

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.vnodes)

    @property
    def rows_compared(self) -> int:
        return sum(v.expected for v in self.vnodes)

    def failures(self) -> list[VnodeVerdict]:
        return [v for v in self.vnodes if not v.ok]


def verify(spark: SparkSession, d: MVDefinition, tables: MVTables,
           vnodes: Sequence[int] | None = None, progress: dict | None = None) -> Verdict:
    """Compare every vnode of the MV with f(upstream@v_k, key <= current_pos_k).

    `progress` (vnode -> (progress, version)) defaults to the progress table; the crash tests
    pass the progress a rerun would recover instead.
    """
    vnodes = list(range(d.vnode_count)) if vnodes is None else list(vnodes)
    upstream = checked_upstream(tables, d, None)
    so = tables.storage_options
    if progress is None:
        progress_table = mv_store.open_table(tables.progress, so)
        progress = (read_progress(progress_table, upstream.key_order, vnodes)
                    if progress_table else {})
    mv = mv_store.open_table(tables.mv, so)
    actual_rows = mv_store.read_rows(mv, vnodes).to_pylist() if mv else []
    actual = defaultdict(Counter)
    for row in actual_rows:
        actual[row["vnode"]][_frozen(row)] += 1
    by_version = defaultdict(list)
    for vnode, (_, version) in progress.items():
        by_version[version].append(vnode)
    expected = defaultdict(Counter)
    for version, group in by_version.items():
        for row in _expected_rows(spark, d, tables, upstream, version, group, progress):
            expected[row["vnode"]][_frozen(row)] += 1
    verdict = Verdict()
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
    table = mv_store.open_table(tables.upstream, tables.storage_options, version)
    names = [f.name for f in upstream.schema]
    rows = mv_store.read_rows(table, None, names).to_pylist()
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
    schema = pa.schema([*upstream.schema, pa.field("vnode", pa.int32())])
    df = spark.createDataFrame(pa.Table.from_pylist(kept, schema=schema),
                               schema=spark_schema(schema))  # explicit: Spark Connect safe
    out = project(df, d).where(KEEP).drop(KEEP).toArrow()
    return out.to_pylist()


def _frozen(row: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))
