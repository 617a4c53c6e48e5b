"""Spark Declarative Pipelines' materialized view of the benchmark's aggregate, run the way its
docs show (benchmarks/bench_aggregate.py).

A pipeline project (`spark-pipeline.yml`: name, storage, `libraries: [glob: transformations/**]`,
as `spark-pipelines init` writes it) whose one Python file defines

    @dp.materialized_view(name="revenue_by_region_day", format="delta")
    def revenue_by_region_day():
        return spark.sql("SELECT region, day, sum(amount * qty) ... GROUP BY region, day")

over the upstream's Delta path. Pipelines need Spark Connect: a Connect server of the open
Spark in the venv (tests/infra/spark_servers.py, Delta's jars and catalog at its start, the
warehouse in the run folder, local[*] and 2 GiB like the platform's session), and the run goes
through `pyspark.pipelines.cli.run`, the function behind `spark-pipelines run --spec` (the
`spark-pipelines` script starts a local server of its own through spark-submit: given
`--jars` or `--conf spark.jars` with Delta's jars it still failed `DATA_SOURCE_NOT_FOUND:
delta` here). Timed: the whole `run` call (session, graph registration, the flow, the MV's
commit); the first is the full computation. The open engine refreshes an MV by TRUNCATE, the
whole query and an append; on a Delta MV that refresh fails here (`Refresh` says how, and
what is measured instead), so a second pipeline keeps the same MV in Spark's default format,
whose refresh runs, measured beside it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C

SPEC = """name: {name}
storage: file://{storage}
configuration:
  spark.sql.shuffle.partitions: "4"
libraries:
  - glob:
      include: transformations/**
"""

DEFINITION = '''from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

spark = SparkSession.active()


@dp.materialized_view(name="{name}"{format})
def {name}() -> DataFrame:
    return spark.sql("""{sql}""")
'''
PARQUET = "_parquet"  # the same MV in Spark's default format, whose refresh runs


def project(folder: str, name: str, uri: str, where: str = "", delta: bool = True) -> Path:
    """A pipeline project whose one MV is the aggregate over `uri` (a Delta table, or in
    Spark's default format); its spec's path."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "transformations"))
    sql = A.SQL.replace("FROM orders", f"FROM delta.`{uri}` {where}")
    with open(os.path.join(folder, "transformations", f"{name}.py"), "w",
              encoding="utf-8") as f:
        f.write(DEFINITION.format(name=name, sql=sql, format=', format="delta"' if delta else ""))
    spec = os.path.join(folder, "spark-pipeline.yml")
    with open(spec, "w", encoding="utf-8") as f:
        f.write(SPEC.format(name=name, storage=os.path.join(folder, "storage")))
    return Path(spec)


def run_pipeline(spec: Path) -> dict:
    """One `spark-pipelines run --spec` (a default update), timed."""
    from pyspark.pipelines import cli

    return R.timed(lambda: cli.run(spec, full_refresh=[], full_refresh_all=False, refresh=[],
                                   dry=False))


def _history(warehouse: str, name: str) -> list[dict]:
    from deltalake import DeltaTable

    found = glob.glob(os.path.join(warehouse, "**", name), recursive=True)
    if not found:
        return []
    return [{k: h.get(k) for k in ("version", "operation", "operationParameters",
                                   "operationMetrics")}
            for h in DeltaTable(found[0]).history(4)]


@contextlib.contextmanager
def _session():
    """A Connect session of our own for one use: `cli.run` stops the session it got from
    `getOrCreate` (SPARK_REMOTE's), which would be ours if we kept one open."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


class Refresh:
    """SDP's refresh after a batch. The Delta MV's own refresh (a default run over the
    existing table) fails on this Spark and Delta: the open engine TRUNCATEs the MV, then sets
    the table's properties, `provider` among them, which Delta refuses
    (DELTA_CANNOT_CHANGE_PROVIDER), leaving the MV empty. The first refresh records that;
    each refresh is then what that run would have done once the truncate passed: the MV
    dropped and computed again at the new version (`seconds`). The same MV in Spark's default
    format refreshes through SDP's own path (TRUNCATE, the whole query, append):
    `parquet_seconds`, the pipeline's second MV."""

    def __init__(self, delta_spec: Path, parquet_spec: Path, warehouse: str) -> None:
        self.delta_spec, self.parquet_spec, self.warehouse = delta_spec, parquet_spec, warehouse
        self.first = True

    def __call__(self) -> dict:
        out: dict = {}
        if self.first:
            self.first = False
            out["default_run"] = self._default_run()
        t0 = time.perf_counter()
        with _session() as spark:
            spark.sql(f"DROP TABLE IF EXISTS {A.MV_NAME}")
        out["drop_seconds"] = round(time.perf_counter() - t0, 3)
        out["seconds"] = round(run_pipeline(self.delta_spec)["seconds"] + out["drop_seconds"], 3)
        out["parquet_seconds"] = run_pipeline(self.parquet_spec)["seconds"]
        return out

    def _default_run(self) -> dict:
        try:
            took = run_pipeline(self.delta_spec)
        except Exception as e:  # noqa: BLE001 - the failure is the figure
            with _session() as spark:
                rows = spark.read.table(A.MV_NAME).count()
            print(f"    SDP's refresh of the Delta MV failed ({str(e)[:160]}...); the MV now "
                  f"holds {rows:,} rows", flush=True)
            return {"failed": str(e)[:600], "mv_rows_after": rows,
                    "mv_history": _history(self.warehouse, A.MV_NAME)}
        return {"seconds": took["seconds"]}


def worker_sdp(args) -> dict:
    from tests.infra.spark_servers import start_connect_server

    run_dir, uri, info = R.private_upstream(args, "sdp")
    warehouse = os.path.join(run_dir, "warehouse")
    os.makedirs(os.path.join(run_dir, "server"))
    server = start_connect_server(os.path.join(run_dir, "server"), master="local[*]", conf={
        "spark.sql.warehouse.dir": warehouse, "spark.driver.memory": "2g"})
    os.environ["SPARK_REMOTE"] = server.remote_url
    try:
        warm = project(os.path.join(run_dir, "warm"), "warm_mv", uri, "WHERE vnode < 8", False)
        for _ in range(2):  # the server's JIT, Delta's classes, the pipeline machinery
            run_pipeline(warm)
        spec = project(os.path.join(run_dir, "pipeline"), A.MV_NAME, uri)
        parquet = project(os.path.join(run_dir, "pipeline_parquet"), A.MV_NAME + PARQUET, uri,
                          delta=False)
        audit = C.CpuAudit()
        out: dict = {"contender": "sdp", "rows": args.rows}
        out["full"] = run_pipeline(spec)
        out["full_parquet"] = run_pipeline(parquet)
        print(f"    SDP full computation: {out['full']['seconds']:.2f}s (Delta MV), "
              f"{out['full_parquet']['seconds']:.2f}s (parquet MV)", flush=True)
        out["cases"] = R.follow_plan(args, uri, info, Refresh(spec, parquet, warehouse))
        for case in out["cases"]:
            case["median_parquet_seconds"] = round(statistics.median(
                r["parquet_seconds"] for r in case["runs"]), 3)
        out.update(audit.result())
        with _session() as spark:
            out["check"] = R.mismatches(spark, spark.read.table(A.MV_NAME), uri)
            out["check_parquet"] = R.mismatches(spark, spark.read.table(A.MV_NAME + PARQUET),
                                                uri)
    finally:
        os.environ.pop("SPARK_REMOTE", None)
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out
