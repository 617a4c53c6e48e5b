"""Who should read a foreign upstream's version: the storage layer or Delta-Spark?

Measures, on one Delta-Spark-written table with deletion vectors (N rows written in F files,
then a DELETE of every 10th key and an UPDATE of every 7th: DVs on most files), the time to
read the whole live version and hash every row of it in Spark:
- ``layer``: ``storage.read_version`` (the platform's bulk path: Python tasks read each file,
  apply its DV, rename physical columns, add partition values);
- ``delta_spark``: ``spark.read.format("delta").load`` (Delta-Spark's own scan, in the JVM).
Both counts are checked equal. Run under the benchmark lock:
``flock /tmp/spark.lock .venv/bin/python -m benchmarks.foreign_read --rows 5000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from backfill_assets import storage
from resources.settings import load_settings
from resources.spark import get_spark


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/foreign_read.json")
    args = parser.parse_args(argv)
    spark = get_spark(load_settings())
    folder = tempfile.mkdtemp(prefix="foreign-read-")
    uri = os.path.join(folder, "upstream")
    spark.sql(f"CREATE TABLE delta.`{uri}` (id BIGINT, name STRING, qty INT, amount "
              "DECIMAL(12,2)) USING delta TBLPROPERTIES (delta.enableDeletionVectors = true, "
              "delta.enableChangeDataFeed = true)")
    (spark.range(args.rows, numPartitions=args.files)
     .selectExpr("id", "concat('n', id % 1000) AS name", "CAST(id % 50 AS INT) AS qty",
                 "CAST((id % 100000) / 100 AS DECIMAL(12,2)) AS amount")
     .write.format("delta").mode("append").save(uri))
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 10 = 0")
    spark.sql(f"UPDATE delta.`{uri}` SET qty = qty + 1 WHERE id % 7 = 0")
    live = spark.read.format("delta").load(uri).count()
    figures: dict[str, list[float]] = {"layer": [], "delta_spark": []}
    for _ in range(args.repeat):
        for name, read in (("layer", lambda: storage.read_version(spark, uri, None)),
                           ("delta_spark", lambda: spark.read.format("delta").load(uri))):
            seconds, _ = _timed(lambda read=read: read().selectExpr(
                "count(*)", "sum(hash(id, name, qty, amount))").collect())
            figures[name].append(round(seconds, 3))
        assert storage.read_version(spark, uri, None).count() == live
    result = {"rows": args.rows, "live_rows": live, "files": args.files,
              "seconds": figures, "best": {k: min(v) for k, v in figures.items()},
              "load": os.getloadavg()[0]}
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
