"""What a Delta user who does not adopt the platform runs to keep the same MV, with
delta-spark: the full refresh, and the Structured Streaming MERGE pattern (issue 38).

Both are written as a user would write them, against the MV definition the benchmarks use
(benchmarks.common.bench_mv, or jobs/configs/mv.yaml for the latency run): the MV's selected
columns and computed columns (Spark SQL expressions), rows kept by its filter, keyed by its
primary key. Neither writes the platform's `vnode` column (a user's MV has none); neither uses
anything of the platform but the definition.

- ``refresh``: ``spark.read.format("delta").option("versionAsOf", v).load(upstream)``,
  ``.where(filter).selectExpr(columns, computed)``, then
  ``.write.format("delta").mode("overwrite").save(mv)``.
- ``ChangeFeedMerge``: the ``foreachBatch`` body of the streaming pattern. The micro-batch is
  the upstream's change feed (``readStream.format("delta").option("readChangeFeed", "true")``)
  since the last batch; it is netted per key (the last change of each key by
  ``_commit_version``, a post-image before a pre-image of the same commit; a key whose last
  change is a delete or a pre-image only, i.e. a pk change's old key, is gone), projected with
  the definition (a row the filter rejects is gone too), and MERGEd into the MV (matched and
  gone: delete; matched: update every column; not matched and not gone: insert). The MV has
  deletion vectors on (``delta.enableDeletionVectors``), so the MERGE marks replaced rows in
  DVs instead of rewriting files.
"""

from __future__ import annotations

import json
import os
import time

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

GONE = "_gone"
DV_DEFAULT = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
# Spark's own default (10 MiB). The platform's session turns broadcast joins off for its reads
# (resources/spark.py); a user's MERGE would broadcast a small change set, so the baselines
# run with the default.
USER_CONF = {"spark.sql.autoBroadcastJoinThreshold": "10485760", DV_DEFAULT: "true"}


def user_session(spark: SparkSession) -> SparkSession:
    """The platform's session (Delta's jars, extension and catalog; local[*], 4 shuffle
    partitions) as a delta-spark user would run it: USER_CONF on top (new tables with deletion
    vectors on; Spark's default broadcast-join threshold)."""
    for k, v in USER_CONF.items():
        spark.conf.set(k, v)
    return spark


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def mv_columns(d) -> list[str]:
    """The MV's columns, in order: selected, then computed."""
    return [*d.columns, *(c.name for c in d.computed)]


def mv_select(d) -> list[str]:
    """The definition as Spark SQL select expressions over upstream rows."""
    return [_quote(c) for c in d.columns] + [f"{c.expr} AS {_quote(c.name)}" for c in d.computed]


def pk_names(d) -> list[str]:
    return [k.name for k in d.primary_key]


def refresh(spark: SparkSession, d, upstream: str, version: int | None, out: str) -> float:
    """The delta-spark full refresh of the MV at ``version`` (None: the latest); seconds."""
    t0 = time.perf_counter()
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(upstream)
    if d.filter:
        df = df.where(d.filter)
    (df.selectExpr(*mv_select(d)).write.format("delta").mode("overwrite")
     .option("overwriteSchema", "true").save(out))
    return time.perf_counter() - t0


def warm_delta(spark: SparkSession, upstream: str, scratch: str) -> None:
    """Load Delta's read, write and MERGE classes once (a few vnodes of the upstream), so no
    measured baseline pays class loading / JIT alone."""
    from delta.tables import DeltaTable

    for _ in range(2):
        part = spark.read.format("delta").load(upstream).where("vnode < 4")
        part.write.format("delta").mode("overwrite").save(scratch)
        src = part.limit(1000)
        (DeltaTable.forPath(spark, scratch).alias("t").merge(src.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        spark.read.format("delta").load(scratch).count()


def net(batch: DataFrame, d) -> DataFrame:
    """One row per key of the batch: the MV's columns and whether the key is gone."""
    rank = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(0)
    w = Window.partitionBy(*[F.col(_quote(k)) for k in pk_names(d)]).orderBy(
        F.col("_commit_version").desc(), rank.desc())
    last = batch.withColumn("_rn", F.row_number().over(w)).where("_rn = 1")
    kept = F.coalesce(F.expr(d.filter), F.lit(False)) if d.filter else F.lit(True)
    gone = F.col("_change_type").isin("delete", "update_preimage") | ~kept
    return last.select(*[F.expr(e) for e in mv_select(d)], gone.alias(GONE))


def merge(spark: SparkSession, d, mv: str, source: DataFrame) -> None:
    """MERGE the netted changes into the MV (deletion vectors: the table's property)."""
    from delta.tables import DeltaTable

    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in pk_names(d))
    values = {_quote(c): f"s.{_quote(c)}" for c in mv_columns(d)}
    (DeltaTable.forPath(spark, mv).alias("t").merge(source.alias("s"), on)
     .whenMatchedDelete(f"s.{GONE}")
     .whenMatchedUpdate(set=values)
     .whenNotMatchedInsert(condition=f"NOT s.{GONE}", values=values)
     .execute())


def enable_deletion_vectors(spark: SparkSession, mv: str) -> None:
    spark.sql(f"ALTER TABLE delta.{_quote(mv)} SET TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true')")


def covered_through(checkpoint: str, batch_id: int) -> int | None:
    """The last upstream version a micro-batch includes, from the offset the stream wrote
    for it before running it (``offsets/<batch_id>``; Delta's source offset is a version and
    a file index in it, -1 meaning none of that version's files yet)."""
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    offset = json.loads(lines[-1])
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    return version - 1 if index == -1 else version


class ChangeFeedMerge:
    """The ``foreachBatch`` function: net, project, MERGE; records each batch's wall time
    (start, end: the MERGE has committed) and the upstream versions it covered."""

    def __init__(self, d, mv: str, checkpoint: str) -> None:
        self.d, self.mv, self.checkpoint = d, mv, checkpoint
        self.batches: list[dict] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        t0 = time.time()
        merge(batch.sparkSession, self.d, self.mv, net(batch, self.d))
        t1 = time.time()
        self.batches.append({"batch_id": batch_id, "start": t0, "end": t1,
                             "seconds": round(t1 - t0, 3),
                             "through": covered_through(self.checkpoint, batch_id)})


def start_stream(spark: SparkSession, upstream: str, starting_version: int, checkpoint: str,
                 sink: ChangeFeedMerge, trigger: dict):
    """``readStream`` of the upstream's change feed from ``starting_version`` into
    ``foreachBatch(sink)``; ``trigger`` as DataStreamWriter.trigger takes it
    (``{"availableNow": True}``, ``{"processingTime": "1 second"}``)."""
    return (spark.readStream.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", starting_version).load(upstream)
            .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(**trigger).start())


def progress_phases(query) -> list[dict]:
    """durationMs of each micro-batch the query ran (Spark's own breakdown)."""
    return [{"batch_id": p["batchId"], "rows": p.get("numInputRows"),
             **{k: v for k, v in (p.get("durationMs") or {}).items()}}
            for p in (query.recentProgress or [])]
