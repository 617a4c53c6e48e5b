"""The change data feed of a version range, read from the log by the layer itself.

Measured: delta-rs 1.6.6 ``load_cdf`` double-encodes partition folders with non-ASCII or
reserved characters (``country=Espa%25C3%25B1a``) and then reports the range as vacuumed. This
reader follows the protocol instead: a version with ``cdc`` actions is read from its change
files only; otherwise its ``add`` actions (``dataChange``) are inserts, its ``remove`` actions
deletes, and a file removed and added again with another DV (remove + add of the same path)
deletes exactly the rows the new DV adds and inserts exactly the rows it no longer deletes
(a DV that shrank or went: a RESTORE, a purge). Partition values come from the actions, keyed
by logical names (``change_log.actions_of``) and typed by the table schema. Change ranges are
a barrier's worth of rows, read here on the driver as Arrow (the caller nets and checks them
before they go to Spark).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from backfill_assets.core.errors import HistoryUnavailable
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.change_log import actions_of as _actions
from backfill_assets.storage.delta.change_log import change_log as _change_log
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows.scan import file_rows
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU

CHANGE_TYPE, VERSION, TIMESTAMP = "_change_type", "_commit_version", "_commit_timestamp"
_UPSERTS = ("insert", "update_postimage")
ROW_BYTES = 100  # bytes of change files per change row when a commit records no metrics
READ_THREADS = 4  # change files read at once (a partitioned upstream: one per partition)


def read_change_range(latest: TableVersion, start_exclusive: int, end: int,
                      columns: Sequence[str] | None = None,
                      vnodes: Iterable[int] | None = None, reuse: bool = False) -> pa.Table:
    """Change rows of versions (start_exclusive, end]: the table's columns (or ``columns``)
    plus ``_change_type``, ``_commit_version`` (int64) and ``_commit_timestamp`` (UTC).
    ``vnodes`` keeps the rows of those vnodes (the table needs a ``vnode`` column).

    The last few ranges read are kept, and ``reuse`` takes the range from them when it is
    there: a no_shuffle barrier reads its range for the changes it forwards, then for its
    window (storage/chunks/cut_window.py), and committed change rows never change. Other reads go
    to the files (a vacuumed range must fail there)."""
    vnodes = None if vnodes is None else sorted({int(x) for x in vnodes})
    key = None if latest.table is None else (
        latest.uri, latest.table.metadata().id, start_exclusive, end,
        None if vnodes is None else tuple(vnodes), latest.arrow_schema)
    table = _RANGES.get(key, touch=False) if key is not None and reuse else None
    if table is None:
        table = _read_range(latest, start_exclusive, end, vnodes)
        if key is not None and table.get_total_buffer_size() <= _RANGE_MAX_BYTES:
            _RANGES.put(key, table)
    if columns is not None:
        table = table.select([*columns, *(c for c in (CHANGE_TYPE, VERSION) if c not in columns)])
    return table


# a barrier's worth of rows each
_RANGES: LRU[tuple, pa.Table] = LRU(4, name="change ranges")
_RANGE_MAX_BYTES = 16 << 20  # a larger range (a long catch-up) is not kept: 64 MiB at most held


def _read_range(latest: TableVersion, start_exclusive: int, end: int,
                vnodes: list[int] | None) -> pa.Table:
    """``read_change_range``'s read: every column, the rows of ``vnodes`` (None: all)."""
    schema = latest.arrow_schema
    physical = {c: latest.physical_names.get(c, c) for c in schema.names
                if c not in latest.partition_columns}
    out = pa.schema([*schema, pa.field(CHANGE_TYPE, pa.string()),
                     pa.field(VERSION, pa.int64()), pa.field(TIMESTAMP, pa.timestamp("us", "UTC"))])
    only = _partitions_of(latest, vnodes)
    reads = [read for v in range(start_exclusive + 1, end + 1)
             for read in _version_changes(latest, v, physical, out, only)]
    if len(reads) > 1:  # many small files (a partitioned upstream): parquet reads release
        with ThreadPoolExecutor(READ_THREADS) as pool:  # the GIL, so they overlap
            pieces = list(pool.map(lambda read: read(), reads))
    else:
        pieces = [read() for read in reads]
    table = pa.concat_tables([out.empty_table(), *pieces])
    if vnodes is not None and only is None:  # files of the vnodes' partitions hold only theirs
        wanted = pa.array(vnodes, schema.field("vnode").type)
        table = table.filter(pc.is_in(table["vnode"], wanted))
    return table


def change_rows(latest: TableVersion, start_exclusive: int, end: int,
                column: str | None = "vnode") -> dict[int, int] | None:
    """Estimated change rows of versions (start_exclusive, end] per value of the integer
    partition column ``column`` (None when the table is not partitioned by it; ``column``
    None: all of them under -1), from the log alone: a version's change rows from its
    commit's operation metrics (inserted + deleted + twice updated: a pre- and a
    post-image), shared among its change files by size; a version without metrics counts
    ``ROW_BYTES`` per row of its files. Why not bytes alone: a small change file is mostly
    its parquet footer (20M rows, 20 versions: 13 MB of change files for 44K rows; 100M:
    24 MB for 220K)."""
    if column is not None and column not in latest.partition_columns:
        return None
    out: dict[int, int] = {}
    for v in range(start_exclusive + 1, end + 1):
        log = _change_log(latest, v)
        files = _change_files(_actions(latest, v))
        total = sum(int(f.get("size") or 0) for f in files)
        for f in files:
            text = (f.get("partitionValues") or {}).get(column) if column else None
            value = -1 if text in (None, "") else int(text)
            size = int(f.get("size") or 0)
            rows = (log.rows * size / total if log.rows is not None and total
                    else size / ROW_BYTES)
            out[value] = out.get(value, 0) + round(rows)
    return out


def _change_files(actions: Sequence[Mapping]) -> list[Mapping]:
    """The files a version's changes are read from: its ``cdc`` files, else its data-changing
    ``add`` and ``remove`` actions."""
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    if cdc:
        return cdc
    return [a[kind] for a in actions for kind in ("add", "remove")
            if kind in a and a[kind].get("dataChange", True)]


def _partitions_of(snap: TableVersion, vnodes: Iterable[int] | None) -> set[str] | None:
    """The ``vnode`` partition values (as the log writes them) whose files hold ``vnodes``'
    rows; None when every file must be read (no vnodes asked for, or a table not partitioned
    by vnode)."""
    if vnodes is None or "vnode" not in snap.partition_columns:
        return None
    return {str(int(v)) for v in vnodes}


def metadata_changed(uri: str, first: int, last: int,
                     storage_options: Mapping[str, str] | None = None,
                     table: DeltaTable | None = None) -> bool:
    """Whether a commit of versions first..last changes the table's metadata (then the
    configuration of an earlier version may differ from the one at ``last``). ``table``
    (opened at ``last`` or later): the commits are parsed once per process
    (storage/delta/change_log.py), not at every call."""
    snap = TableVersion(uri.rstrip("/"), dict(storage_options or {}), table)
    return any("metaData" in a for v in range(first, last + 1) for a in _actions(snap, v))


def _version_changes(snap: TableVersion, v: int, physical: Mapping[str, str], out: pa.Schema,
                     only: set[str] | None = None) -> list[Callable[[], pa.Table]]:
    """The reads (not yet run) that yield the change rows of version ``v``; ``only``: read just
    the files of those ``vnode`` partition values."""
    actions = _actions(snap, v)
    if only is not None:
        actions = [a for a in actions if not any(
            kind in a and (a[kind].get("partitionValues") or {}).get("vnode") not in only
            for kind in ("cdc", "add", "remove"))]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)  # change_log adds one
    consts = {VERSION: v, TIMESTAMP: int(info["timestamp"]) * 1000}
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    if len(cdc) > 1 and snap.column_mapping == "none":
        return [partial(_read_cdc_files, snap, cdc, out, consts)]
    if cdc:
        with_type = {**physical, CHANGE_TYPE: CHANGE_TYPE}
        return [partial(_read, snap, f, with_type, out, consts) for f in cdc]
    adds = {a["add"]["path"]: a["add"] for a in actions
            if "add" in a and a["add"].get("dataChange", True)}
    removes = {a["remove"]["path"]: a["remove"] for a in actions
               if "remove" in a and a["remove"].get("dataChange", True)}
    pieces = []
    for path, rm in removes.items():
        old = dv.load(snap.uri, rm.get("deletionVector"), snap.storage_options)
        if path in adds:  # the same file with another DV: it grew, shrank, went or was swapped
            now = dv.load(snap.uri, adds[path].get("deletionVector"), snap.storage_options)
            # rows the new DV deletes are deleted; rows it no longer deletes are live again
            # (a RESTORE, a DV dropped or shrunk): Delta's change feed reports them as inserts
            for action, kind, rows in ((rm, "delete", now - old), (adds[path], "insert",
                                                                     old - now)):
                if len(rows):
                    pieces.append(partial(_read, snap, action, physical, out,
                                          {**consts, CHANGE_TYPE: kind}, only=rows))
        else:
            pieces.append(partial(_read, snap, rm, physical, out,
                                  {**consts, CHANGE_TYPE: "delete"}, deleted=old))
    for path, add in adds.items():
        if path not in removes:
            deleted = dv.load(snap.uri, add.get("deletionVector"), snap.storage_options)
            pieces.append(partial(_read, snap, add, physical, out,
                                  {**consts, CHANGE_TYPE: "insert"}, deleted=deleted))
    return pieces


def _read_cdc_files(snap: TableVersion, cdc: Sequence[Mapping], out: pa.Schema,
                    consts: Mapping[str, object]) -> pa.Table:
    """The change files of one version, read together (a partitioned upstream writes one per
    partition a commit touched: hundreds of files, each a fixed cost when read one by one
    through the checked per-file path). A local disk reads them one after the other, each
    file's bytes whole (threads contend for the GIL on small files, and a dataset scan costs
    more than the bytes: `make bench-change-floor`); a remote store in one dataset scan, whose
    pre-buffering coalesces the requests. Partition values come from each file's action. A
    file whose columns or types do not fit the table's falls back to the file-by-file read
    (which checks and casts each file). The rows come back in one chunk: what nets and
    checks them next pays per chunk."""
    uris = [snap.file_uri(a["path"]) for a in cdc]
    local = objects.is_local(snap.uri)
    if not local:  # a local read finds a vacuumed file by opening it
        for uri in uris:
            _check_exists(snap, uri)
    fields = [f for f in out if f.name not in (VERSION, TIMESTAMP)]
    try:
        read = _read_local if local else _scan_remote
        table = read(snap, cdc, uris, fields, out)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, _Unfit):
        physical = {f.name: f.name for f in fields
                    if f.name not in snap.partition_columns}
        return pa.concat_tables([out.empty_table()] + [
            _read(snap, a, physical, out, consts) for a in cdc])
    for name, value in consts.items():
        table = table.append_column(out.field(name),
                                    pa.repeat(pa.scalar(value, out.field(name).type),
                                              table.num_rows))
    return table.select(out.names)


class _Unfit(Exception):
    """A change file lacks a column of the table (the checked per-file read handles it)."""


def _read_local(snap: TableVersion, cdc: Sequence[Mapping], uris: Sequence[str],
                fields: Sequence[pa.Field], out: pa.Schema) -> pa.Table:
    import pyarrow.parquet as pq

    stored = pa.schema([f for f in fields if f.name not in snap.partition_columns])

    def one(uri: str) -> pa.Table:
        try:
            with open(objects.local_path(uri), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            _check_exists(snap, uri)  # gone: HistoryUnavailable
            raise
        return pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)

    tables = [one(uri) for uri in uris]
    # one writer's files share a schema (delta-rs writes strings as string_view): checked
    # and cast once (concat_tables refuses tables whose schemas differ)
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowInvalid:
        table = None
    if table is not None:
        _check_fits(table.schema, stored, uris[0])
        table = table.select(stored.names).combine_chunks().cast(stored)
    else:
        for t, uri in zip(tables, uris, strict=True):
            _check_fits(t.schema, stored, uri)
        table = pa.concat_tables([t.select(stored.names).cast(stored)
                                  for t in tables]).combine_chunks()
    files = np.repeat(np.arange(len(tables)), [t.num_rows for t in tables])
    for f in fields:
        if f.name in snap.partition_columns:
            texts = [(a.get("partitionValues") or {}).get(f.name) for a in cdc]
            values = _typed_texts(texts, f.type)
            table = table.append_column(f, values.take(pa.array(files)))
    return table


def _check_fits(schema: pa.Schema, stored: pa.Schema, uri: str) -> None:
    if not set(stored.names) <= set(schema.names):
        raise _Unfit(uri)


def _scan_remote(snap: TableVersion, cdc: Sequence[Mapping], uris: Sequence[str],
                 fields: Sequence[pa.Field], out: pa.Schema) -> pa.Table:
    import pyarrow.dataset as ds

    fs, _ = objects.filesystem(uris[0], snap.storage_options)
    paths = [objects.filesystem(u, snap.storage_options)[1] for u in uris]
    partitions = [_partition_expression(a.get("partitionValues") or {}, out) for a in cdc]
    options = ds.ParquetFragmentScanOptions(pre_buffer=True)
    return ds.FileSystemDataset.from_paths(
        paths, schema=pa.schema(fields),
        format=ds.ParquetFileFormat(default_fragment_scan_options=options), filesystem=fs,
        partitions=partitions).to_table()


def _partition_expression(values: Mapping[str, str | None], out: pa.Schema):
    """The dataset expression that fills a file's partition columns (typed from the log)."""
    import pyarrow.dataset as ds

    row = _partition_row(values, out)
    expr = ds.scalar(True)
    for name in row.column_names if row is not None else []:
        value = row.column(name)[0]
        expr = expr & (ds.field(name).is_null() if not value.is_valid
                       else ds.field(name) == value)
    return expr


def _check_exists(snap: TableVersion, uri: str) -> None:
    if not objects.exists(uri, snap.storage_options):
        raise HistoryUnavailable(
            f"changes of {snap.uri} are no longer available: {uri}, which its change feed "
            "needs, is gone (vacuumed); rebuild from the latest version or keep history "
            "longer (delta.deletedFileRetentionDuration)")


def _read(snap: TableVersion, action: Mapping, physical: Mapping[str, str], out: pa.Schema,
          consts: Mapping[str, object], **masks) -> pa.Table:
    uri = snap.file_uri(action["path"])
    _check_exists(snap, uri)
    parts = _partition_row(action.get("partitionValues") or {}, out)
    return file_rows(uri, snap.storage_options, physical, out, partition=parts,
                     constants=consts, **masks)


def _partition_row(values: Mapping[str, str | None], out: pa.Schema) -> pa.Table | None:
    """Partition values as the log serializes them (text), typed by the schema."""
    if not values:
        return None
    return pa.table({name: _typed_texts([text], out.field(name).type)
                     for name, text in values.items()})


def _typed_texts(texts: Sequence[str | None], t: pa.DataType) -> pa.Array:
    """Partition values' texts as an array of type ``t`` (an empty text is null except for a
    string; timestamps are written 'YYYY-MM-DD HH:MM:SS[.ffffff]', possibly ISO with T/Z)."""
    clean = [None if x is None or (x == "" and not pa.types.is_string(t)) else x for x in texts]
    if pa.types.is_timestamp(t):
        naive = pa.array([None if x is None else x.replace("T", " ").rstrip("Z") for x in clean],
                         pa.string())
        return naive.cast(pa.timestamp("us")).cast(t)
    if pa.types.is_boolean(t):
        return pa.array([None if x is None else x.lower() == "true" for x in clean], pa.bool_())
    return pa.array(clean, pa.string()).cast(t)
