"""Rows from Spark into a Delta table without passing them through the driver.

Spark writes parquet files inside the table's folder; deltalake then commits exactly those
files in one transaction (`create_write_transaction`), together with the removal of the files
they replace. That commit checks neither file existence nor schema, so the DataFrame is cast to
the table schema first and per-file stats are read back from the parquet footers (cheap: no
data pages are read).

Keyed changes are merged copy-on-write: only the files whose vnode and key range can hold a
changed key are read and rewritten (`mv_store.files_holding`), so a barrier costs what it
changes, not the size of the table, and no table-sized buffer ever sits in the driver (a
delta-rs merge reads every file of the touched partitions into the driver process).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from functools import reduce
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_assets.delta_store import arrow_schema
from backfill_assets.errors import ConcurrentBackfillRun
from backfill_assets.mv_store import files_holding
from backfill_assets.spark_ops import spark_schema, spark_type

STAGING = "_spark"
COMMIT_ATTEMPTS = 5
# Rows per file of a rewritten (or freshly copied) vnode: small key-sorted files, so the next
# keyed change rewrites one of them instead of the whole vnode (`files_holding` prunes by their
# exact key ranges).
CLUSTERED_FILE_ROWS = 8192


def clustered(df: DataFrame, key_names: Sequence[str]) -> DataFrame:
    """`df` shuffled by vnode and key-sorted inside it: written with CLUSTERED_FILE_ROWS, each
    vnode gets a few range files instead of one more file per Spark task and vnode."""
    return df.repartition("vnode").sortWithinPartitions(
        "vnode", *[F.col(f"`{k}`") for k in key_names])


def append_dataframe(df: DataFrame, table: DeltaTable, props: CommitProperties,
                     max_rows_per_file: int = 0) -> int:
    """Append `df` (with a `vnode` column) to the vnode-partitioned `table`; return rows added.
    `max_rows_per_file` splits a vnode's rows into several files (0: no limit)."""
    return commit_dataframe(df, table, props, max_rows_per_file=max_rows_per_file)


def merge_dataframe(changes: DataFrame, table: DeltaTable, key_names: Sequence[str],
                    props: CommitProperties, inserts: DataFrame | None = None) -> int:
    """One commit applying netted keyed `changes` (table columns + `_op`: 'upsert' | 'delete')
    copy-on-write, plus `inserts`: rows whose keys cannot be in the table yet (a snapshot chunk).
    Returns the rows written."""
    keys = changes.select("vnode", *[F.col(f"`{k}`") for k in key_names])
    touched = files_holding(table, keys.toArrow(), key_names)
    parts = [changes.where(F.col("_op") == "upsert").drop("_op")]
    if touched:
        root = _root(table)
        old = (changes.sparkSession.read.schema(spark_schema(arrow_schema(table)))
               .option("basePath", root)
               .parquet(*[os.path.join(root, unquote(f["path"])) for f in touched]))
        parts.append(old.join(F.broadcast(keys), on=["vnode", *key_names], how="left_anti"))
    # the rewritten rows are re-clustered (without it every merge adds a file per task and
    # vnode, and the files it must rewrite next time multiply); a snapshot chunk's inserts
    # arrive one key-sorted partition per vnode already
    parts = [clustered(reduce(_union, parts), key_names)]
    if inserts is not None:
        parts.append(inserts)
    now = int(time.time() * 1000)
    removes = [RemoveAction(f["path"], True, now, f["size_bytes"], {"vnode": str(f["vnode"])})
               for f in touched]
    return commit_dataframe(reduce(_union, parts), table, props, removes,
                            max_rows_per_file=CLUSTERED_FILE_ROWS)


def _union(a: DataFrame, b: DataFrame) -> DataFrame:
    return a.unionByName(b, allowMissingColumns=False)


def commit_dataframe(df: DataFrame, table: DeltaTable, props: CommitProperties,
                     removes: Sequence[RemoveAction] = (), max_rows_per_file: int = 0) -> int:
    """Write `df` as new files and commit them, with `removes`, in one transaction; rows added."""
    schema = arrow_schema(table)
    root = _root(table)
    run_dir = f"{STAGING}/{uuid.uuid4().hex}"
    casted = df.select(*[F.col(f"`{f.name}`").cast(spark_type(f.type)).alias(f.name)
                         for f in schema])
    (casted.write.option("maxRecordsPerFile", max_rows_per_file).partitionBy("vnode")
     .parquet(os.path.join(root, run_dir)))
    actions = list(_add_actions(root, run_dir, schema))
    # only this run's folder: another run may be writing its own beside it right now
    shutil.rmtree(os.path.join(root, run_dir), ignore_errors=True)
    _commit(table, [*actions, *removes], schema, props)
    return sum(json.loads(a.stats)["numRecords"] for a in actions)


def _commit(table: DeltaTable, actions: list, schema: pa.Schema,
            props: CommitProperties) -> None:
    """Commit `actions`; after losing the race for a version, commit again on the newer one
    when the winners touched nothing of this step: none of its app transactions moved and every
    file it removes is still there (delta-rs' own retry refuses any winner that removed files,
    since a hand-made transaction declares no read predicate; runs over disjoint vnodes must
    both commit)."""
    ids = [t.app_id for t in props.app_transactions or []]
    seen = {i: table.transaction_version(i) for i in ids}
    removed = {a.path for a in actions if isinstance(a, RemoveAction)}
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            table.create_write_transaction(actions, mode="append", schema=schema,
                                           partition_by=["vnode"], commit_properties=props)
            return
        except CommitFailedError as exc:
            table.update_incremental()
            active = set(pa.table(table.get_add_actions()).column("path").to_pylist())
            moved = [i for i in ids if table.transaction_version(i) != seen[i]]
            gone = sorted(removed - active)
            if moved or gone or attempt == COMMIT_ATTEMPTS - 1:
                what = (f"app transactions {moved[:4]} moved" if moved else
                        f"{len(gone)} files this step rewrites are gone" if gone else
                        f"{COMMIT_ATTEMPTS} attempts lost")
                raise ConcurrentBackfillRun(
                    f"another run committed to {table.table_uri} for the same vnodes while "
                    f"this one was working ({what}: {str(exc).splitlines()[0]}); nothing of "
                    "this step was written: rerun it, and give concurrent runs disjoint vnode "
                    "ranges"
                ) from exc


def _root(table: DeltaTable) -> str:
    return table.table_uri.removeprefix("file://")


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
