"""The store must be what the log and the writer say, or the barrier stops by name."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PythonException

from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage import (
    Intent,
    TableVersion,
    append,
    ensure_mor_table,
    read_table_version,
)
from backfill_assets.storage.rows.write import NewFile, check_written

SCHEMA = pa.schema([("id", pa.int64()), ("vnode", pa.int32())])
pytestmark = [pytest.mark.spark]


def _table(spark, uri: str, rows: int = 10) -> TableVersion:
    ensure_mor_table(uri, SCHEMA, None, cdf=False)
    df = spark.createDataFrame([(i, i % 2) for i in range(rows)], "id long, vnode int")
    append(spark, TableVersion.load(uri), df, ["id"], Intent(), rows)
    return TableVersion.load(uri)


def test_a_file_with_other_rows_than_the_log_records_fails_the_read(spark, tmp_path):
    snap = _table(spark, str(tmp_path / "t"))
    path = os.path.join(snap.uri, snap.files[0].path)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()),
                             "vnode": pa.array([0], pa.int32())}), path)
    with pytest.raises(PythonException, match="StorageMismatch|records 10"):
        read_table_version(spark, snap).collect()


def test_a_written_file_the_driver_cannot_see_is_never_committed(tmp_path):
    uri = str(tmp_path / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=False)
    ghost = NewFile("part-on-an-executor-disk.parquet", 1234, 10, "{}")
    with pytest.raises(StorageMismatch, match="executors and driver do not share"):
        check_written(uri, {}, [ghost])
    assert TableVersion.load(uri).files == []
