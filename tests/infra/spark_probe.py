"""A driver process for the cluster and Connect smoke tests: ``python -m tests.infra.spark_probe``.

Why a separate process: this test process owns a local classic session (one per JVM), and a
Connect client turns Connect mode on for its whole process. The probe builds the session the
way a Dagster run does (``resources.spark.spark_resource()`` from the environment), runs a
Python UDF and an Arrow task (``mapInArrow``, the storage layer's data path) and, when
``PROBE_TABLE_URI`` is set, has every task write a parquet file to that URI through
``backfill_assets.storage.store.objects`` with the options passed in the closure - executors write
to the store, the driver only lists. It prints one JSON line of facts.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from resources.spark import spark_resource

    session = spark_resource().spark_session
    uri = os.environ.get("PROBE_TABLE_URI")
    options = json.loads(os.environ.get("PROBE_STORAGE_OPTIONS", "{}")) or None

    @F.udf(T.StringType())
    def where(_):
        import os as _os
        import sys as _sys

        return f"{_os.getpid()}|{_sys.executable}"

    rows = session.range(0, 1000, numPartitions=4)
    seen = {r[0] for r in rows.select(where("id")).distinct().collect()}

    def write_parts(batches):
        import uuid

        import pyarrow as _pa
        import pyarrow.parquet as _pq

        from backfill_assets.storage import objects

        for batch in batches:
            count = batch.num_rows
            if uri and count:
                fs, path = objects.filesystem(f"{uri}/part-{uuid.uuid4().hex}.parquet", options)
                if type(fs).__name__ == "LocalFileSystem":
                    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                _pq.write_table(_pa.Table.from_batches([batch]), path, filesystem=fs)
            yield _pa.RecordBatch.from_pydict({"rows": [count]})

    written = rows.mapInArrow(write_parts, "rows long").agg(F.sum("rows")).collect()[0][0]
    # an empty frame needs an explicit schema on Spark Connect (it cannot infer one)
    empty = session.createDataFrame(pa.table({"id": pa.array([], pa.int64())}),
                                    schema="id long").count()
    try:  # the spelling storage/rows/scan.py uses for an empty version
        from pyspark.sql.types import LongType, StructField, StructType

        struct = StructType([StructField("id", LongType())])
        empty_list_ok = session.createDataFrame([], struct).count() == 0
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        empty_list_ok = f"{type(exc).__name__}: {str(exc)[:200]}"
    facts = {
        "empty_list_ok": empty_list_ok,
        "driver_pid": os.getpid(),
        "executors": sorted(seen),
        "rows_written": int(written),
        "empty_rows": int(empty),
        "connect": bool(os.environ.get("SPARK_CONNECT_MODE_ENABLED")),
        "master": None if os.environ.get("SPARK_CONNECT_MODE_ENABLED")
        else session.sparkContext.master,
    }
    if uri:
        from backfill_assets.storage import objects

        facts["files"] = len(objects.list_prefix(uri, options))
    print("PROBE " + json.dumps(facts), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
