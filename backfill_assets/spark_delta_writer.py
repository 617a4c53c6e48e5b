"""Bulk rows from Spark into a Delta table without passing them through the driver.

Spark writes parquet files inside the table's folder; deltalake then commits exactly those
files in one transaction (`create_write_transaction`). That commit checks neither file
existence nor schema, so the DataFrame is cast to the table schema first and per-file stats are
read back from the parquet footers (cheap: no data pages are read).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_assets.delta_store import arrow_schema
from backfill_assets.spark_ops import spark_type

STAGING = "_spark"


def append_dataframe(df: DataFrame, table: DeltaTable, props: CommitProperties) -> int:
    """Append `df` (with a `vnode` column) to the vnode-partitioned `table`; return rows added."""
    schema = arrow_schema(table)
    root = table.table_uri.removeprefix("file://")
    run_dir = f"{STAGING}/{uuid.uuid4().hex}"
    casted = df.select(*[F.col(f"`{f.name}`").cast(spark_type(f.type)).alias(f.name)
                         for f in schema])
    casted.write.partitionBy("vnode").parquet(os.path.join(root, run_dir))
    actions = list(_add_actions(root, run_dir, schema))
    # only this run's folder: another run may be writing its own beside it right now
    shutil.rmtree(os.path.join(root, run_dir), ignore_errors=True)
    table.create_write_transaction(actions, mode="append", schema=schema,
                                   partition_by=["vnode"], commit_properties=props)
    return sum(json.loads(a.stats)["numRecords"] for a in actions)


def _add_actions(root: str, run_dir: str, schema: pa.Schema) -> Iterator[AddAction]:
    """Move Spark's files into the table's own `vnode=K/` folders (so readers that discover
    partitions from paths see one layout) and describe each as an add action."""
    now = int(time.time() * 1000)
    staging = os.path.join(root, run_dir)
    tag = os.path.basename(run_dir)
    for folder, _, files in os.walk(staging):
        for name in files:
            if not name.endswith(".parquet"):
                continue
            vnode = os.path.relpath(folder, staging).split("vnode=")[1].split("/")[0]
            rel = f"vnode={vnode}/{tag}-{name}"
            os.makedirs(os.path.join(root, f"vnode={vnode}"), exist_ok=True)
            os.replace(os.path.join(folder, name), os.path.join(root, rel))
            yield AddAction(rel, os.path.getsize(os.path.join(root, rel)), {"vnode": vnode},
                            now, True, _stats(os.path.join(root, rel), schema))


def _stats(path: str, schema: pa.Schema) -> str:
    """Delta file stats (numRecords, min, max, nullCount) from a parquet footer."""
    meta = pq.read_metadata(path)
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    names = meta.schema.names
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for i, name in enumerate(names):
            st = group.column(i).statistics
            if st is None or not st.has_min_max:
                nulls[name] = nulls.get(name, 0) + (st.null_count if st else 0)
                continue
            lo, hi = _jsonable(st.min), _jsonable(st.max)
            if lo is not None:
                mins[name] = lo if name not in mins else min(mins[name], lo)
                maxs[name] = hi if name not in maxs else max(maxs[name], hi)
            nulls[name] = nulls.get(name, 0) + (st.null_count or 0)
    wanted = {f.name for f in schema if _stat_friendly(f.type)}
    return json.dumps({
        "numRecords": meta.num_rows,
        "minValues": {k: v for k, v in mins.items() if k in wanted},
        "maxValues": {k: v for k, v in maxs.items() if k in wanted},
        "nullCount": nulls,
    })


def _stat_friendly(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_floating(t)


def _jsonable(value: object) -> object:
    return value if isinstance(value, (int, float, str)) else None
