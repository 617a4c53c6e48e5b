"""A Spark Connect client process for the Delta-over-Connect test:
``python -m tests.interop.connect_probe`` with BACKFILL_SPARK_REMOTE and PROBE_MV set.

It builds its session as a Dagster run does (``resources.spark.spark_resource()``) and tries,
on the server's Delta (its jars, extension and catalog come with the server's own conf), what
a user does with our MV from a Connect client: read it, time-travel it, read its change feed,
DESCRIBE HISTORY; then writes, MERGEs and OPTIMIZEs a table of its own with SQL; and the
Python ``DeltaTable`` API, which needs a Delta Connect plugin on the server. One JSON line of
facts, each step's result or the first line of its error.
"""

from __future__ import annotations

import json
import os


def main() -> None:
    from resources.spark import spark_resource

    spark = spark_resource().spark_session
    mv, scratch = os.environ["PROBE_MV"], os.environ["PROBE_SCRATCH"]
    facts: dict[str, object] = {}

    def step(name: str, fn) -> None:
        try:
            facts[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a fact to report, not to hide
            facts[name] = f"error: {str(exc).splitlines()[0][:200]}"

    step("mv_rows", lambda: spark.read.format("delta").load(mv).count())
    step("mv_v1_rows", lambda: spark.read.format("delta").option("versionAsOf", 1)
         .load(mv).count())
    step("mv_feed_rows", lambda: spark.read.format("delta").option("readChangeFeed", "true")
         .option("startingVersion", 1).load(mv).count())
    step("mv_history", lambda: len(spark.sql(f"DESCRIBE HISTORY delta.`{mv}`").collect()))
    step("write", lambda: spark.range(10).selectExpr("id", "id * 2 AS v").write
         .format("delta").save(scratch) or "ok")
    step("merge", lambda: spark.sql(
        f"MERGE INTO delta.`{scratch}` t USING (SELECT id, id * 3 AS v FROM range(5, 15)) s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
         .collect() and "ok")
    step("scratch_rows", lambda: spark.read.format("delta").load(scratch).count())
    step("optimize", lambda: spark.sql(f"OPTIMIZE delta.`{scratch}`").collect() and "ok")

    def python_api():
        from delta.tables import DeltaTable

        return DeltaTable.forPath(spark, scratch).toDF().count()

    step("python_delta_table", python_api)
    print("PROBE " + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
