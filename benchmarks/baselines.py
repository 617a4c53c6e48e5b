"""The baselines every benchmark measures its figures against, on the same rows in the same
run: (a) a Spark copy, (b) a pyarrow copy, (c) the naive full refresh of the MV, and (d) the
full refresh written in the storage layer's layout (rows of a task in (vnode, key) order), the
least work any backfill that keeps that layout can do, and (e) the plain JVM Spark copy of the
version's files. The delta-spark baselines (what a Delta user runs instead) are in
benchmarks/delta_spark.py."""

from __future__ import annotations

import shutil
import time


def spark_copy(spark, uri: str, version: int, out: str) -> float:
    """Baseline (a): read the version's parquet files with Spark, write them as parquet."""
    from backfill_assets import storage

    schema = storage.arrow_schema(storage.open_table(uri, version))
    t0 = time.perf_counter()
    df = storage.read_version(spark, uri, version, schema)
    df.write.mode("overwrite").parquet(out)
    return time.perf_counter() - t0


def pyarrow_copy(uri: str, version: int, out: str) -> float:
    """Baseline (b): a pyarrow dataset scan of the version's files written back as parquet
    (streamed, multi-threaded: the machine's practical read+write limit)."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    files = [u.removeprefix("file://") for u in DeltaTable(uri, version=version).file_uris()]
    dataset = ds.dataset(files, format="parquet")
    shutil.rmtree(out, ignore_errors=True)
    ds.write_dataset(dataset, out, format="parquet", existing_data_behavior="overwrite_or_ignore",
                     max_rows_per_file=4_000_000, max_rows_per_group=1_000_000)
    return time.perf_counter() - t0


def full_refresh(spark, d, uri: str, version: int, out: str) -> float:
    """Baseline (c): recompute the whole MV from the upstream version (the same projection and
    filter, backfill_assets.engine.projection.project) and overwrite it as parquet."""
    from pyspark.sql import functions as F

    from backfill_assets import storage
    from backfill_assets.engine.projection import KEEP, project

    schema = storage.arrow_schema(storage.open_table(uri, version))
    t0 = time.perf_counter()
    df = storage.read_version(spark, uri, version, schema)
    mv = project(df, d).where(F.col(KEEP)).drop(KEEP)
    mv.write.mode("overwrite").parquet(out)
    return time.perf_counter() - t0


def clustered_refresh(spark, d, uri: str, version: int, out: str) -> float:
    """Baseline (d): the full refresh (c) with each task's rows sorted by (vnode, key) before
    they are written, as the MV's layout requires (files clustered by (vnode, key) with
    narrow exact bounds: what lets a small barrier probe few files). No shuffle: a read task of
    a vnode-partitioned upstream holds one vnode range already. The floor of snapshot mode's
    bulk phase, which must write that layout."""
    from pyspark.sql import functions as F

    from backfill_assets import storage
    from backfill_assets.engine.projection import KEEP, project

    schema = storage.arrow_schema(storage.open_table(uri, version))
    t0 = time.perf_counter()
    df = storage.read_version(spark, uri, version, schema)
    mv = project(df, d).where(F.col(KEEP)).drop(KEEP)
    keys = [F.col(f"`{k.name}`") for k in d.primary_key]
    mv.sortWithinPartitions(F.col("vnode"), *keys).write.mode("overwrite").parquet(out)
    return time.perf_counter() - t0


def jvm_spark_copy(spark, uri: str, version: int, out: str) -> float:
    """Baseline (e), a floor: the plain JVM Spark copy of the version's data files,
    ``spark.read.parquet(*files).write.parquet(out)`` (files listed by delta-rs inside the
    clock; no Delta log, no Python tasks: what the JVM alone reads and writes; the files hold
    no deleted rows at the benchmarks' bulk version, which has no DML yet)."""
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    files = [u.removeprefix("file://") for u in DeltaTable(uri, version=version).file_uris()]
    spark.read.parquet(*files).write.mode("overwrite").parquet(out)
    return time.perf_counter() - t0
