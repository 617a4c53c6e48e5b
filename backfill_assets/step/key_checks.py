"""Null or duplicate primary keys another engine wrote into the upstream: refused by name.

The platform's DML writer never writes them (upstream.apply_dml), but an upstream written by
another engine (a plain deltalake or Spark append) can hold them, and the MV cannot key such
rows. A step checks what it reads before it writes anything:
- the change chunk, per version (Arrow, cheap): a null pk, or a key one version inserts twice
  (or deletes twice);
- the snapshot of vnodes that start in this step (one Spark pass over their rows, once per
  vnode, before their replica or MV rows are written);
- every snapshot chunk: a null pk or twice the same key, flagged by the chunk's own window
  (`engine.projection.select_chunk`, the row's key against the previous row's) and read with its
  per-vnode stats, so it costs no extra Spark pass.
- keys the change chunk inserts into vnodes that already started (`check_inserted_keys`): an
  insert (or a pk change's new key) without a delete of the same key in the same version is
  how a second row for an existing key arrives from a writer that does not enforce the pk;
  those keys are looked up in the upstream at the step's version (a semi-join on the key
  columns only), and a key held twice is refused. Without it the duplicate was silently lost:
  the replica and the MV upsert it over the existing row.
Together these keep the invariant "every key the backfill carries is unique at the version it
is at": a vnode is checked whole when it starts, and afterwards only the keys that changed can
have become duplicates.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_assets.core.errors import BadPrimaryKeyInUpstream
from backfill_assets.core.names import SEEN
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.storage import col

_FIX = ("fix those rows in the upstream (or primary_key in the MV definition), then rerun; "
        "nothing was written")


def check_change_keys(raw: pa.Table, key_names: Sequence[str], uri: str) -> None:
    """Change-feed rows (with `_change_type`, `_commit_version`): no null pk, and no key that
    one version inserts twice or deletes twice."""
    _refuse_null_keys(raw, key_names, uri, "its change data feed")
    new = pc.is_in(raw["_change_type"], pa.array(["insert", "update_postimage"]))
    sides = raw.select([*key_names, "_commit_version"]).append_column("_new", new)
    counts = sides.group_by([*key_names, "_commit_version", "_new"],
                            use_threads=False).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts["count_all"], 1))
    if dup.num_rows:
        row = dup.slice(0, 1).to_pylist()[0]
        raise BadPrimaryKeyInUpstream(
            f"upstream {uri} version {row['_commit_version']} writes the primary key "
            f"{_key_text(row, key_names)} {row['count_all']} times (duplicate rows): the MV "
            f"needs a unique pk; {_FIX}"
        )


def check_inserted_keys(changes: DataFrame, upstream: DataFrame, started: Sequence[int],
                        key_names: Sequence[str], uri: str, version: int) -> None:
    """`changes`: change rows (`vnode`, `_change_type`, `_commit_version`, key columns);
    `upstream`: the upstream's rows at `version` with `vnode`. Refuse a key that a version
    inserts into a started vnode without deleting it, and that the upstream then holds twice."""
    if not started:
        return
    keys = [col(k) for k in key_names]
    new = F.col("_change_type").isin("insert", "update_postimage").cast("int")
    inserted = (changes.where(owned_tables.vnode_in(started))
                .groupBy(*keys, "_commit_version")
                .agg(F.min(new).alias(SEEN)).where(F.col(SEEN) == 1)
                .groupBy(*keys).agg(F.max("_commit_version").alias("_commit_version")))
    held = (upstream.where(owned_tables.vnode_in(started)).select(*keys)
            .join(F.broadcast(inserted), list(key_names), "inner")
            .groupBy(*keys, "_commit_version").agg(F.count(F.lit(1)).alias(SEEN))
            .where(F.col(SEEN) > 1).limit(1).collect())
    if held:
        row = held[0].asDict()
        raise BadPrimaryKeyInUpstream(
            f"upstream {uri} version {row['_commit_version']} inserts the primary key "
            f"{_key_text(row, key_names)} again: at version {version} it has {row[SEEN]} rows "
            f"with the primary key {_key_text(row, key_names)} (its writer does not enforce "
            f"the pk); {_FIX}"
        )


def check_inserted_keys_local(rows: pa.Table, tables: MVTables, key_names: Sequence[str],
                              vnode_count: int, version: int) -> None:
    """`check_inserted_keys` for a small barrier (change rows on the driver, finished vnodes):
    the inserted keys are counted in the upstream at `version` by reading only the key columns
    of the files whose statistics admit them. Skipped when every row of the upstream came from
    the platform's writer, which enforces the pk (`upstream.layout.keys_kept_unique`)."""
    from backfill_assets import storage
    from backfill_assets.arrow import netting
    from backfill_assets.upstream import keys_kept_unique

    so = tables.storage_options
    if not rows.num_rows or keys_kept_unique(tables.upstream, version, key_names, vnode_count,
                                             so):
        return
    inserted = netting.inserted_keys(rows, key_names)
    if not inserted.num_rows:
        return
    snap = storage.TableVersion.load(tables.upstream, version, so)
    counts = storage.key_counts(snap, inserted, key_names)
    twice = counts.filter(pc.greater(counts.column("count"), 1))
    if twice.num_rows:
        row = twice.join(inserted, list(key_names)).slice(0, 1).to_pylist()[0]
        raise BadPrimaryKeyInUpstream(
            f"upstream {tables.upstream} version {row['_commit_version']} inserts the primary "
            f"key {_key_text(row, key_names)} again: at version {version} it has "
            f"{row['count']} rows with the primary key {_key_text(row, key_names)} (its "
            f"writer does not enforce the pk); {_FIX}"
        )


def check_snapshot_keys(rows: DataFrame, key_names: Sequence[str], uri: str,
                        version: int) -> None:
    """Spark rows of the upstream at `version`: no null pk, no key twice."""
    keys = [col(k) for k in key_names]
    null = reduce(lambda a, b: a | b, [k.isNull() for k in keys])
    bad = (rows.groupBy(*keys).agg(F.count(F.lit(1)).alias(SEEN))
           .where((F.col(SEEN) > 1) | null).limit(1).collect())
    if bad:
        row = bad[0].asDict()
        _refuse_snapshot_key(row, row[SEEN], key_names, uri, version)


def refuse_flagged_chunk_key(chunk: DataFrame, flag: str, key_names: Sequence[str], uri: str,
                             version: int) -> None:
    """A chunk whose window flagged a row (`flag`: null pk, or the previous row's pk): name the
    key and how many rows of the chunk hold it."""
    row = chunk.where(F.col(flag)).select(*[col(k) for k in key_names]).first()
    if row is None:
        return
    key = row.asDict()
    same = reduce(lambda a, b: a & b, [col(k).eqNullSafe(key[k]) for k in key_names])
    _refuse_snapshot_key(key, chunk.where(same).count(), key_names, uri, version)


def _refuse_snapshot_key(row: dict, count: int, key_names: Sequence[str], uri: str,
                         version: int) -> None:
    what = "a null" if any(row[k] is None for k in key_names) else f"{count} rows with the"
    raise BadPrimaryKeyInUpstream(
        f"upstream {uri} at version {version} has {what} primary key "
        f"{_key_text(row, key_names)}: the MV needs a unique, non-null pk; {_FIX}"
    )


def _refuse_null_keys(rows: pa.Table, key_names: Sequence[str], uri: str, where: str) -> None:
    for k in key_names:
        if rows[k].null_count:
            raise BadPrimaryKeyInUpstream(
                f"upstream {uri} has rows with a null primary-key column {k!r} in {where}: the "
                f"MV needs a non-null pk; {_FIX}"
            )


def _key_text(row: dict, key_names: Sequence[str]) -> str:
    return "(" + ", ".join(f"{k}={row[k]!r}" for k in key_names) + ")"
