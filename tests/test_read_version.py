"""Spark adapter: reading a Delta version as parquet (pruned by vnode, empty versions, time
travel) and the Spark resource sharing the process's one session."""

from __future__ import annotations

import os
import sys

import dagster as dg
import pytest
from dagster_pyspark import LazyPySparkResource

from backfill_assets import storage
from backfill_assets.upstream.writer import DmlBatch, UpstreamSpec, apply_dml, create_upstream

pytestmark = pytest.mark.spark

SPEC = UpstreamSpec("t", {"id": "bigint", "v": "string", "d": "decimal(6,2)", "ts": "timestamp"},
                    ("id",), 8)


def _rows(df) -> list[dict]:
    return sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])


@pytest.fixture
def table(warehouse) -> str:
    uri = os.path.join(warehouse, "t")
    create_upstream(uri, SPEC)
    apply_dml(uri, DmlBatch(inserts=[{"id": i, "v": str(i)} for i in range(40)]))
    apply_dml(uri, DmlBatch(deletes=list(range(10)), updates=[{"id": 20, "v": "x"}]))
    return uri


def test_read_version_matches_delta(spark, table):
    from backfill_assets.storage import read_version

    for version in (1, 2, None):
        got = _rows(read_version(spark, table, version))
        want = sorted(storage.read_table(table, version).to_pylist(), key=lambda r: r["id"])
        assert got == want
    assert len(_rows(read_version(spark, table, 1))) == 40
    assert len(_rows(read_version(spark, table, 2))) == 30


def test_read_version_prunes_vnodes(spark, table):
    from backfill_assets.storage import TableVersion, files_in_vnodes, read_version

    files_all = TableVersion.load(table, 2).files
    files_some = files_in_vnodes(files_all, [1, 2])
    assert 0 < len(files_some) < len(files_all)
    rows = _rows(read_version(spark, table, 2, vnodes=[1, 2]))
    assert rows and {r["vnode"] for r in rows} <= {1, 2}
    assert rows == [r for r in _rows(read_version(spark, table, 2)) if r["vnode"] in (1, 2)]
    assert read_version(spark, table, 2, vnodes=[]).count() == 0


def test_empty_version_has_the_schema(spark, table):
    from backfill_assets.storage import read_version

    df = read_version(spark, table, 0)
    assert df.count() == 0
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("id", "bigint"), ("v", "string"), ("d", "decimal(6,2)"), ("ts", "timestamp"),
        ("vnode", "int")]


def test_with_vnode_recomputes(spark, table):
    from backfill_assets.core.vnode import vnode_of
    from backfill_assets.engine.netting import with_vnode
    from backfill_assets.storage import read_version

    df = with_vnode(read_version(spark, table, None), ["id"], ["bigint"], 3)
    assert all(r["vnode"] == vnode_of((r["id"],), ["bigint"], 3) for r in _rows(df))


def test_resource_shares_the_session(spark):
    from resources.settings import load_settings
    from resources.spark import spark_resource

    @dg.op
    def probe(spark: LazyPySparkResource) -> dict:
        s = spark.spark_session
        return {"app": s.sparkContext.applicationId,
                "tz": s.conf.get("spark.sql.session.timeZone"),
                "python": os.environ.get("PYSPARK_PYTHON")}

    @dg.job(resource_defs={"spark": spark_resource(load_settings())})
    def job():
        probe()

    out = job.execute_in_process().output_for_node("probe")
    assert out == {"app": spark.sparkContext.applicationId, "tz": "UTC", "python": sys.executable}


def test_resource_points_executors_at_this_interpreter(spark, monkeypatch):
    from resources.settings import load_settings
    from resources.spark import spark_resource

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    res = spark_resource(load_settings())
    assert res.spark_session.sparkContext.applicationId == spark.sparkContext.applicationId
    assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    # a Python UDF runs in a worker started with that interpreter
    from pyspark.sql import functions as F

    exe = F.udf(lambda _: __import__("sys").executable)
    assert spark.range(1).select(exe("id")).first()[0] == sys.executable
