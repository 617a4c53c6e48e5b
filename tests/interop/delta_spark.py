"""Delta-Spark, the reference implementation, as a second oracle: its own reads of a table at a
version and of its change feed, compared with delta-rs' (an independent reader) and with the
rows the platform's oracle recomputes.

`assert_mv_as_delta_spark_reads` is the oracle of an MV over a foreign upstream that shares
nothing with the platform's readers: the upstream at the version each vnode's progress
records, read by Delta-Spark (`versionAsOf`: deletion vectors, column mapping, checkpoints,
partition values as the reference implementation honours them), restricted to each vnode's
backfilled keys (the progress table, read by Delta-Spark too), the definition's filter and
computed columns applied by Spark SQL; compared row for row with the MV (read by delta-rs, an
independent reader) and column for column by type.

Every check goes through the session's Delta catalog (`format("delta")`, `readChangeFeed`,
`DESCRIBE HISTORY` / `DETAIL`): the jars resources/delta_jars.py puts on every classic
session, nothing fetched at run time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import functions as F

from backfill_assets.arrow.types import type_name
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.vnode import spark_vnode_sql
from backfill_assets.mv.owned_tables import MVTables
from tests.foreign import spark_quote

CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def canon(row: dict) -> str:
    return json.dumps({k: str(v) for k, v in row.items() if k not in CDF_COLUMNS},
                      sort_keys=True)


def multiset(rows: Sequence[dict]) -> Counter:
    return Counter(canon(r) for r in rows)


def spark_rows(spark, uri: str, version: int | None = None) -> list[dict]:
    """Delta-Spark's read of ``uri`` (at ``version``), as plain rows."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return [r.asDict() for r in reader.load(uri).collect()]


def spark_changes(spark, uri: str, start: int, end: int) -> list[dict]:
    """Delta-Spark's change feed of versions [start, end]."""
    df = (spark.read.format("delta").option("readChangeFeed", "true")
          .option("startingVersion", start).option("endingVersion", end).load(uri))
    return [r.asDict() for r in df.collect()]


def assert_versions_read_alike(spark, uri: str, first: int, last: int) -> int:
    """Every version in [first, last]: Delta-Spark's rows == delta-rs' rows (both honour
    deletion vectors, column mapping and partition values); the versions checked."""
    for v in range(first, last + 1):
        theirs = multiset(spark_rows(spark, uri, v))
        ours = multiset(pa.table(DeltaTable(uri, version=v).scan()).to_pylist())
        assert theirs == ours, f"{uri} v{v}: Delta-Spark and delta-rs read different rows"
    return last - first + 1


def assert_feed_replays(spark, uri: str, key_names: Sequence[str], start: int, end: int
                        ) -> None:
    """Delta-Spark's change feed of (start, end] applied to the rows of ``start`` gives the
    rows of ``end``: each delete / pre-image removes a held row exactly, each insert /
    post-image adds a key not held. What a user's streaming MERGE would do with our MV."""
    def key(r: dict) -> tuple:
        return tuple(str(r[k]) for k in key_names)

    held = {key(r): canon(r) for r in spark_rows(spark, uri, start)}
    feed = spark_changes(spark, uri, start + 1, end)
    for v in sorted({r["_commit_version"] for r in feed}):
        rows = [r for r in feed if r["_commit_version"] == v]
        for r in rows:
            if r["_change_type"] in ("delete", "update_preimage"):
                assert held.pop(key(r), None) == canon(r), f"{uri} v{v} removes {r}: not held"
        for r in rows:
            if r["_change_type"] in ("insert", "update_postimage"):
                assert key(r) not in held, f"{uri} v{v} inserts a held key: {r}"
                held[key(r)] = canon(r)
    now = {key(r): canon(r) for r in spark_rows(spark, uri, end)}
    assert held == now, f"{uri}: the change feed ({start}, {end}] does not replay"


def assert_history_and_detail(spark, uri: str) -> None:
    """DESCRIBE HISTORY lists every version the log keeps, newest first; DESCRIBE DETAIL
    counts the live files delta-rs counts."""
    latest = DeltaTable(uri).version()
    history = [r["version"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()]
    assert history[0] == latest and history == sorted(history, reverse=True)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0].asDict()
    assert detail["format"] == "delta"
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).num_rows
    assert detail["numFiles"] == files


# ------------------------------------------------------- an MV over a foreign upstream


def recorded_versions(spark, tables: MVTables) -> set[int]:
    """The upstream versions the progress table records (one once a barrier over every vnode
    found them all finished)."""
    prog = spark.read.format("delta").load(tables.progress).select("version").toArrow()
    return set(prog.column(0).to_pylist())


def delta_spark_mv(spark, d: MVDefinition, tables: MVTables) -> pa.Table:
    """f(upstream @ each vnode's recorded version, its backfilled keys), by Delta-Spark alone:
    its reads of the upstream and of the progress table, Spark SQL for the definition."""
    key = d.primary_key[0]
    assert len(d.primary_key) == 1 and not key.descending, "one ascending key column here"
    progress = spark.read.format("delta").load(tables.progress)
    key_type = progress.schema[key.name].dataType.simpleString()  # the platform's key types
    vnode = spark_vnode_sql([key.name], [key_type], d.vnode_count)
    keep = F.coalesce(F.expr(d.filter), F.lit(False)) if d.filter else F.lit(True)
    parts = []
    for version in sorted(recorded_versions(spark, tables)):
        at = progress.where(F.col("version") == version).select(
            F.col("vnode").alias("__vnode"), F.col(spark_quote(key.name)).alias("__pos"),
            F.col("backfill_finished").alias("__finished"))
        up = spark.read.format("delta").option("versionAsOf", version).load(d.upstream)
        up = up.withColumn("__v", F.expr(vnode))
        kept = up.join(at, up["__v"] == at["__vnode"]).where(
            at["__finished"] | (F.col(spark_quote(key.name)) <= at["__pos"])).where(keep)
        parts.append(kept.select(*[F.col(spark_quote(c)) for c in d.columns],
                                 *[F.expr(c.expr).alias(c.name) for c in d.computed],
                                 F.col("__v").alias("vnode")).toArrow())
    return pa.concat_tables(parts) if parts else None


def assert_mv_as_delta_spark_reads(spark, d: MVDefinition, tables: MVTables) -> int:
    """The MV == Delta-Spark's recompute, row for row, each column's type exact; the rows
    compared."""
    want = delta_spark_mv(spark, d, tables)
    mv = pa.table(DeltaTable(tables.mv).scan())
    if want is None:
        assert mv.num_rows == 0, "rows in the MV with no progress recorded"
        return 0
    types = {f.name: type_name(f.type) for f in want.schema}
    have = {f.name: type_name(f.type) for f in mv.schema}
    assert have == types, f"MV column types {have} != Delta-Spark's {types}"
    expected = multiset(want.to_pylist())
    actual = multiset(mv.select(want.schema.names).to_pylist())
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (
        f"MV != Delta-Spark's recompute at v{sorted(recorded_versions(spark, tables))}: "
        f"{sum(missing.values())} missing, e.g. {list(missing)[:2]}; {sum(extra.values())} "
        f"unexpected, e.g. {list(extra)[:2]}")
    return want.num_rows
