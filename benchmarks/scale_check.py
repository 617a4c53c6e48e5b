"""The benchmarks' check of a finished MV at sizes the oracle cannot hold.

`backfill_assets.verify.oracle` keeps every row as a Python object (about 12 GB at 5M rows; at 20M
the machine's 24 GiB killed it in round 9). At 20M and 100M rows the benchmarks compare the
MV with a recompute by another path instead, per vnode and without any row on the driver:

- expected: the upstream's live files at the version every vnode recorded (the list from the
  log), read by Spark's own parquet reader (not the storage layer's reader; partition values
  from the file paths), the MV
  definition's filter and computed columns evaluated by Spark SQL (not the Arrow compiler the
  bulk tasks use). Refused when that version's files carry deletion vectors: Spark's reader
  would count deleted rows (use the oracle on such a table);
- actual: the MV read back by the storage layer's reader (deletion vectors applied);
- per vnode: the row count and the sum of a 64-bit hash of every column (a multiset
  fingerprint: a missing, extra or changed row changes it), plus the MV's column types
  against the definition's.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.progress import Completed
from backfill_assets.engine import netting
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.preflight import checked_upstream


def scale_check(spark: SparkSession, d: MVDefinition, tables: MVTables) -> dict:
    """{"ok", "vnodes", "rows", "version", "mismatched" (vnodes), "types"} for a finished MV."""
    so = tables.storage_options
    upstream = checked_upstream(tables, d, None)
    progress = read_progress(owned_tables.open_if_exists(tables.progress, so), upstream.key_order,
                             list(range(d.vnode_count)))
    versions = {v for _, v in progress.values()}
    if len(progress) != d.vnode_count or len(versions) != 1 or \
            not all(isinstance(p, Completed) for p, _ in progress.values()):
        raise ValueError("scale_check needs every vnode Completed at one version; use the oracle")
    version = versions.pop()
    expected = _expected(spark, d, tables, version, list(upstream.key_order.names),
                         list(upstream.key_types))
    actual = storage.read_version(spark, tables.mv, None, storage_options=so)
    types = [f"{c}: MV {actual.schema[c].dataType.simpleString()}, expected "
             f"{expected.schema[c].dataType.simpleString()}"
             for c in expected.columns if c not in actual.columns
             or actual.schema[c].dataType != expected.schema[c].dataType]
    columns = [c for c in expected.columns if c in actual.columns]
    want, got = _fingerprint(expected, columns), _fingerprint(actual, columns)
    bad = sorted(v for v in set(want) | set(got) if want.get(v) != got.get(v))
    return {"ok": not bad and not types, "vnodes": len(want),
            "rows": sum(n for n, _ in want.values()), "version": version,
            "mismatched": bad[:20], "types": types}


def _expected(spark: SparkSession, d: MVDefinition, tables: MVTables, version: int,
              key_names: list[str], key_types: list[str]) -> DataFrame:
    snap = storage.TableVersion.load(tables.upstream, version, tables.storage_options)
    if any(f.deletion_vector for f in snap.files):  # delta-rs' add actions do not show DVs
        raise ValueError(f"{tables.upstream} v{version} has deletion vectors: use the oracle")
    files = [snap.file_uri(f.path) for f in snap.files]
    rows = spark.read.option("basePath", tables.upstream).parquet(*files)
    return _project(netting.with_vnode(rows, key_names, key_types, d.vnode_count), d)


def _project(rows: DataFrame, d: MVDefinition) -> DataFrame:
    keep = F.coalesce(F.expr(d.filter), F.lit(False)) if d.filter else F.lit(True)
    return rows.where(keep).select(*[F.col(c) for c in d.columns],
                                   *[F.expr(c.expr).alias(c.name) for c in d.computed],
                                   F.col("vnode"))


def _fingerprint(rows: DataFrame, columns: list[str]) -> dict[int, tuple[int, int]]:
    digest = F.xxhash64(*[F.col(c) for c in columns]).cast("decimal(38,0)")
    out = rows.groupBy("vnode").agg(F.count(F.lit(1)).alias("n"), F.sum(digest).alias("h"))
    return {r["vnode"]: (r["n"], int(r["h"])) for r in out.collect()}
