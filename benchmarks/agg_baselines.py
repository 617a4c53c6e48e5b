"""What a delta-spark user runs instead of an aggregate MV (benchmarks/bench_aggregate.py):

- **GROUP BY + overwrite** (the honest recompute): `spark.read.format("delta").load(orders)
  .groupBy(region, day).agg(sum(amount * qty), count(*), avg(amount))`, then
  `write.format("delta").mode("overwrite")`. Every refresh reads the whole upstream.
- **foreachBatch + MERGE**: the aggregate written once by the GROUP BY, then a Structured
  Streaming query on the upstream's change feed (`readChangeFeed`, `trigger(availableNow)`
  after each commit), whose `foreachBatch` adds signed deltas per group with one MERGE:
  +1 for an insert or a post-image, -1 for a delete or a pre-image, so it handles pre-images.
  It keeps two columns a user must add for avg (the price sum and count) and deletes a group
  whose count reaches 0. Exact for count, sum and avg; it could not retract a min or max.
  Written without the pre-images (only inserts and post-images added, the form a Delta sink
  in append mode would take), it gets every deleted row and every moved row's old group
  wrong: the run counts the groups such a pattern would leave wrong (`naive_wrong_groups`).

Each runs in its own process (the platform's Spark session as a user runs it:
benchmarks/delta_spark.py `user_session`), on a private copy of the cached upstream.
"""

from __future__ import annotations

import os
import shutil
import time

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C
from benchmarks import delta_spark as DS

SIGN = ("CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 "
        "WHEN _change_type IN ('delete', 'update_preimage') THEN -1 END")


def overwrite(spark, uri: str, out: str) -> None:
    """The recompute: the whole upstream's GROUP BY, overwriting the aggregate."""
    (R.recompute(spark, uri).write.format("delta").mode("overwrite")
     .option("overwriteSchema", "true").save(out))


def _session():
    spark, _ = C.start_spark()
    return DS.user_session(spark)


def worker_overwrite(args) -> dict:
    run_dir, uri, info = R.private_upstream(args, "overwrite")
    spark = _session()
    C.warm_read(spark, uri)
    mv = os.path.join(run_dir, "mv")
    try:
        overwrite(spark, uri, os.path.join(run_dir, "warm"))  # JIT and Delta's write classes
        audit = C.CpuAudit()
        out: dict = {"contender": "overwrite", "rows": args.rows}
        out["full"] = R.timed(lambda: overwrite(spark, uri, mv))
        print(f"    full GROUP BY + overwrite: {out['full']['seconds']:.2f}s", flush=True)
        out["cases"] = R.follow_plan(args, uri, info,
                                     lambda: R.timed(lambda: overwrite(spark, uri, mv)))
        out.update(audit.result())
        out["check"] = R.mismatches(spark, spark.read.format("delta").load(mv), uri)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _initial(spark, uri: str, mv: str) -> None:
    """The aggregate with the two columns avg needs kept beside it."""
    from pyspark.sql import functions as F

    (spark.read.format("delta").load(uri).groupBy(*A.GROUP_COLUMNS)
     .agg(F.expr("sum(amount * qty)").alias("revenue"), F.count(F.lit(1)).alias("orders"),
          F.sum("amount").cast("decimal(22,2)").alias("price_sum"),
          F.count("amount").alias("price_n"))
     .withColumn("avg_price", F.expr("cast(price_sum / price_n AS decimal(16,6))"))
     .write.format("delta").mode("overwrite").save(mv))
    DS.enable_deletion_vectors(spark, mv)


class SignedMerge:
    """The foreachBatch body: signed deltas per group, one MERGE adding them."""

    def __init__(self, mv: str) -> None:
        self.mv, self.seconds, self.naive_wrong, self.naive_seconds = mv, [], [], []

    def __call__(self, batch, batch_id: int) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        deltas = batch.withColumn("s", F.expr(SIGN)).groupBy(*A.GROUP_COLUMNS).agg(
            F.expr("sum(s * amount * qty)").alias("d_revenue"), F.sum("s").alias("d_orders"),
            F.expr("sum(s * amount)").alias("d_price_sum"),
            F.expr("sum(CASE WHEN amount IS NULL THEN 0 ELSE s END)").alias("d_price_n"))
        on = " AND ".join(f"t.{c} <=> s.{c}" for c in A.GROUP_COLUMNS)
        new_n = "t.price_n + s.d_price_n"
        new_sum = "t.price_sum + s.d_price_sum"
        (DeltaTable.forPath(batch.sparkSession, self.mv).alias("t")
         .merge(deltas.alias("s"), on)
         .whenMatchedDelete("t.orders + s.d_orders = 0")
         .whenMatchedUpdate(set={
             "revenue": "t.revenue + s.d_revenue", "orders": "t.orders + s.d_orders",
             "price_sum": new_sum, "price_n": new_n,
             "avg_price": f"CASE WHEN {new_n} = 0 THEN NULL ELSE "
                          f"cast(({new_sum}) / ({new_n}) AS decimal(16,6)) END"})
         .whenNotMatchedInsert(values={
             **{c: f"s.{c}" for c in A.GROUP_COLUMNS}, "revenue": "s.d_revenue",
             "orders": "s.d_orders", "price_sum": "s.d_price_sum", "price_n": "s.d_price_n",
             "avg_price": "cast(s.d_price_sum / s.d_price_n AS decimal(16,6))"})
         .execute())
        self.seconds.append(time.perf_counter() - t0)
        # without the pre-images every group a delete or a pre-image touches stays wrong;
        # counted outside the figure (the query's time less this count's)
        t1 = time.perf_counter()
        self.naive_wrong.append(batch.where("_change_type IN ('delete', 'update_preimage')")
                                .select(*A.GROUP_COLUMNS).distinct().count())
        self.naive_seconds.append(time.perf_counter() - t1)


def worker_merge(args) -> dict:
    from deltalake import DeltaTable

    run_dir, uri, info = R.private_upstream(args, "merge")
    spark = _session()
    C.warm_read(spark, uri)
    mv, ckpt = os.path.join(run_dir, "mv"), os.path.join(run_dir, "checkpoint")
    try:
        DS.warm_delta(spark, uri, os.path.join(run_dir, "warm"))
        v0 = DeltaTable(uri).version()
        out: dict = {"contender": "merge", "rows": args.rows}
        out["initial"] = R.timed(lambda: _initial(spark, uri, mv))
        sink = SignedMerge(mv)
        audit = C.CpuAudit()

        def one_query() -> dict:
            n = len(sink.seconds)
            t = time.perf_counter()
            q = DS.start_stream(spark, uri, v0 + 1, ckpt, sink, {"availableNow": True})
            q.awaitTermination()
            secs = time.perf_counter() - t - sum(sink.naive_seconds[n:])
            return {"seconds": round(secs, 3),
                    "merge_seconds": round(sum(sink.seconds[n:]), 3),
                    "naive_wrong_groups": sum(sink.naive_wrong[n:])}

        out["cases"] = R.follow_plan(args, uri, info, one_query)
        out.update(audit.result())
        out["check"] = R.mismatches(spark, spark.read.format("delta").load(mv), uri)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out
