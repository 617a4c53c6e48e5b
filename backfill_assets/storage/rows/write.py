"""Rows from Spark into new data files of a table, without passing through the driver.

Spark tasks (``mapInArrow``) write parquet through the store's pyarrow filesystem straight to
the file's final place (no staging folder, no move), compute the Delta statistics while they
write, and return one manifest row per file. The driver then checks every file of the manifest
is in the store with the size the task wrote, before any commit names it: an executor that
wrote to a disk the driver cannot see fails the barrier instead of committing nothing.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage.rows.key_bounds import _key_bounds, in_key_sort_order
from backfill_assets.storage.store import objects

MANIFEST = "path string, size long, rows long, stats string"
DEFAULT_FILE_ROWS = 1 << 20
ROW_GROUP_ROWS = 1 << 17
# table property: rows per row group; small groups of (vnode, key)-sorted files let a keyed
# read (rows/keyed_read.py) open only the groups whose min/max statistics admit its keys
ROW_GROUP_ROWS_PROPERTY = "backfill.rowGroupRows"
STAT_STRING_LIMIT = 32  # longer strings get no min/max (a truncated bound would not be exact)


def row_group_rows(configuration: Mapping[str, str]) -> int:
    """Rows per row group the table's configuration asks its writers for."""
    return int(configuration.get(ROW_GROUP_ROWS_PROPERTY) or 0) or ROW_GROUP_ROWS


KEY_BOUNDS = "backfill.keyBounds"  # add-action tag: [first key, last key] in key order, exact


@dataclass(frozen=True)
class NewFile:
    """A data file a task wrote: path relative to the table root, as the log will name it.
    ``tags``: its add action's tags (``KEY_BOUNDS``: the exact first and last key of a file
    written with a key order, what a seek of a composite key needs)."""

    path: str
    size: int
    rows: int
    stats: str
    tags: dict | None = None

    @classmethod
    def of(cls, row: dict) -> NewFile:
        """A manifest row: the task passes the key bounds inside its stats text."""
        stats, tags = row["stats"], None
        if KEY_BOUNDS in stats:
            parsed = json.loads(stats)
            tags = {KEY_BOUNDS: parsed.pop(KEY_BOUNDS)}
            stats = json.dumps(parsed)
        return cls(row["path"], row["size"], row["rows"], stats, tags)


def write_files(df: DataFrame, table_uri: str, storage_options: Mapping[str, str],
                schema: pa.Schema, *, folder: str = "", prefix: str = "part",
                max_rows_per_file: int = DEFAULT_FILE_ROWS,
                split_column: str | None = None,
                row_group_rows: int = ROW_GROUP_ROWS) -> list[NewFile]:
    """Write ``df`` (columns of ``schema``, cast to its types) as parquet files under
    ``table_uri/folder``, each task's rows in order, at most ``max_rows_per_file`` per file.
    ``split_column``: a file never holds two values of it (rows must come grouped by it), and
    a value's rows are cut every ``max_rows_per_file`` rows: the replica's one-vnode,
    key-sorted files that a chunk read seeks by, each a chunk long, so that chunks can end
    where files end (``core.positions.chunk_cut``). ``row_group_rows``: rows per row group
    (``row_group_rows(configuration)`` of the table)."""
    # positional names: pyspark's mapInArrow resolves each column name as an attribute path,
    # which fails for names with dots ("a.b"); the task renames them back (by position)
    columns = [f"`{f.name.replace('`', '``')}` AS c{i}" for i, f in enumerate(schema)]
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                        folder, prefix, max_rows_per_file or DEFAULT_FILE_ROWS, split_column,
                        row_group_rows=row_group_rows)
    manifest = df.selectExpr(*columns).mapInArrow(writer, MANIFEST).collect()
    files = [NewFile.of(r) for r in manifest]
    check_written(table_uri, storage_options, files)
    return files


def write_table(table: pa.Table, table_uri: str, storage_options: Mapping[str, str],
                schema: pa.Schema, *, folder: str = "", prefix: str = "part",
                max_rows_per_file: int = DEFAULT_FILE_ROWS,
                key_sort: list[tuple[str, str]] | None = None,
                row_group_rows: int = ROW_GROUP_ROWS,
                footer_stats: Sequence[str] | None = None) -> list[NewFile]:
    """``write_files`` for rows already on the driver (a small barrier): the same files,
    statistics and manifest check, written by the driver itself instead of Spark tasks.
    ``footer_stats``: the only columns whose Parquet min/max the footer keeps (None: all)."""
    if not table.num_rows:
        return []
    writer = FileWriter(table_uri, dict(storage_options), schema.serialize().to_pybytes(),
                        folder, prefix, max_rows_per_file or DEFAULT_FILE_ROWS,
                        key_sort=key_sort, row_group_rows=row_group_rows,
                        footer_stats=footer_stats)
    batches = table.select(schema.names).to_batches()
    manifest = pa.Table.from_batches(list(writer(iter(batches))))
    files = [NewFile.of(r) for r in manifest.to_pylist()]
    check_written(table_uri, storage_options, files)
    return files


def check_written(table_uri: str, storage_options: Mapping[str, str],
                  files: list[NewFile]) -> None:
    """Every file of the manifest is in the store at its written size."""
    for f in files:
        found = objects.size(objects.join(table_uri, f.path), storage_options)
        if found != f.size:
            raise StorageMismatch(
                f"a Spark task wrote {f.path} ({f.size} bytes) but the driver finds "
                f"{'no file' if found is None else f'{found} bytes'} at {table_uri}: executors "
                "and driver do not share this store (a local folder on a cluster?); point "
                "BACKFILL_WAREHOUSE at storage every node reaches. Nothing was committed")


class FileWriter:
    """The task side (picklable): rolling parquet files with Delta stats."""

    def __init__(self, table_uri: str, options: Mapping[str, str], schema: bytes,
                 folder: str, prefix: str, max_rows: int, split_column: str | None = None,
                 key_sort: list[tuple[str, str]] | None = None,
                 row_group_rows: int = ROW_GROUP_ROWS, footer_stats: Sequence[str] | None = None):
        self.table_uri, self.options, self.schema = table_uri, options, schema
        self.row_group_rows, self.footer_stats = row_group_rows, footer_stats
        self.folder, self.prefix, self.max_rows = folder.strip("/"), prefix, max_rows
        self.split_column, self.key_sort = split_column, key_sort

    def __call__(self, batches):
        import pyarrow.parquet as pq

        schema = pa.ipc.read_schema(pa.py_buffer(self.schema))
        tables = (pa.Table.from_batches([b]).rename_columns(schema.names).cast(schema)
                  for b in batches)
        if self.split_column is not None:
            yield from self._split(tables, schema, pq)
            return
        current = None
        for table in tables:
            offset = 0
            while offset < table.num_rows:
                if current is None:
                    current = _OpenFile(self, schema, pq)
                take = min(self.max_rows - current.rows, table.num_rows - offset)
                current.write(table.slice(offset, take))
                offset += take
                if current.rows >= self.max_rows:
                    yield current.close()
                    current = None
        if current is not None:
            yield current.close()

    def _split(self, tables, schema: pa.Schema, pq):
        """Files of one value each: a value's rows are held until the next value starts
        (one vnode of a replica: its rows / vnode count), then cut every ``max_rows``."""
        held: list[pa.Table] = []
        current = None
        for table in tables:
            values = table.column(self.split_column).to_numpy(zero_copy_only=False)
            starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if len(values) \
                else []
            for i, start in enumerate(starts):
                stop = starts[i + 1] if i + 1 < len(starts) else len(values)
                if held and values[start] != current:
                    yield from self._cut(pa.concat_tables(held), schema, pq)
                    held = []
                current = values[start]
                held.append(table.slice(start, stop - start))
        if held:
            yield from self._cut(pa.concat_tables(held), schema, pq)

    def _cut(self, rows: pa.Table, schema: pa.Schema, pq):
        # one order check for the value's rows, not one per file (a 20M-row replica's copy
        # writes 5,120 files): a slice of rows in order is in order
        ordered = bool(self.key_sort) and in_key_sort_order(
            rows.select([name for name, _ in self.key_sort]), self.key_sort)
        stats = _Stats.of_slices(rows, schema, self.max_rows)
        for i, start in enumerate(range(0, max(1, rows.num_rows), self.max_rows)):
            out = _OpenFile(self, schema, pq, ordered, None if stats is None else stats[i])
            out.write(rows.slice(start, self.max_rows))
            yield out.close()


class _OpenFile:
    def __init__(self, spec: FileWriter, schema: pa.Schema, pq, ordered: bool = False,
                 stats: _Stats | None = None):
        name = f"{spec.prefix}-{uuid.uuid4()}.parquet"
        self.path = f"{spec.folder}/{name}" if spec.folder else name
        uri = objects.join(spec.table_uri, self.path)
        fs, path = objects.filesystem(uri, spec.options)
        if objects.is_local(uri):
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        self.stream = fs.open_output_stream(path)
        # plain encoding: dictionary pages make a task's write several times slower for
        # files no smaller once snappy has compressed them. Footer min/max of only some
        # columns (``footer_stats``): a file of one row group, whose log statistics say as
        # much, or a change file, which nothing prunes by row group
        footer = True if spec.footer_stats is None else list(spec.footer_stats) or False
        self.writer = pq.ParquetWriter(self.stream, schema, compression="snappy",
                                       use_dictionary=False, write_statistics=footer)
        self.fs, self.fs_path, self.rows = fs, path, 0
        self.preset = stats is not None  # the stats of all it will hold, computed by the caller
        self.stats = stats if stats is not None else _Stats(schema)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.key_sort, self.ordered = spec.key_sort, ordered  # ordered: rows known in order
        self.group_rows = spec.row_group_rows
        self.keys: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        """Buffered into row groups of ``group_rows``: Spark hands a task's rows over in
        batches of 10,000, and a row group per batch makes files slower to write and read."""
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if not self.preset:
            self.stats.add(table)
        self.rows += table.num_rows
        if self.key_sort:
            self.keys.append(table.select([name for name, _ in self.key_sort]))
        if self.pending_rows >= self.group_rows:
            self._flush()

    def _flush(self, last: bool = False) -> None:
        """Whole groups written (all rows when ``last``), the rest kept: else each batch that
        is no multiple of the group size would leave a short group."""
        if not self.pending:
            return
        rows = pa.concat_tables(self.pending)
        whole = rows.num_rows if last else rows.num_rows - rows.num_rows % self.group_rows
        if whole:
            self.writer.write_table(rows.slice(0, whole), row_group_size=self.group_rows)
        rest = rows.slice(whole)
        self.pending, self.pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> pa.RecordBatch:
        self._flush(last=True)
        self.writer.close()
        self.stream.close()
        size = self.fs.get_file_info(self.fs_path).size
        stats = self.stats.json(self.rows, _key_bounds(self.keys, self.key_sort or [],
                                                       self.ordered))
        return pa.RecordBatch.from_pylist([{"path": self.path, "size": size, "rows": self.rows,
                                            "stats": stats}])


class _Stats:
    """numRecords, exact min/max (ints, floats, dates, short strings) and null counts."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.mins: dict = {}
        self.maxs: dict = {}
        self.nulls: dict = {f.name: 0 for f in schema}

    def add(self, table: pa.Table) -> None:
        for f in self.schema:
            col = table.column(f.name)
            self.nulls[f.name] += col.null_count
            if not _has_exact_stats(f.type) or col.null_count == len(col):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is None:
                continue
            self.mins[f.name] = lo if f.name not in self.mins else min(self.mins[f.name], lo)
            self.maxs[f.name] = hi if f.name not in self.maxs else max(self.maxs[f.name], hi)

    @classmethod
    def of_slices(cls, rows: pa.Table, schema: pa.Schema, size: int) -> list[_Stats] | None:
        """The stats of each ``size``-row slice of ``rows``, from one hash aggregation (the
        replica's copy cuts every vnode into files of one chunk, 20 per vnode at 20M rows:
        ten ``min_max`` calls per file cost as much as its parquet encoding); None when a
        column type has no hash aggregate (the caller then counts file by file)."""
        out = [cls(schema) for _ in range(max(1, math.ceil(rows.num_rows / size)))]
        if not rows.num_rows:
            return out
        exact = [f.name for f in schema if _has_exact_stats(f.type)]
        aggs = [(c, "min") for c in exact] + [(c, "max") for c in exact] + [
            (f.name, "count", pc.CountOptions(mode="only_null")) for f in schema]
        slices = pa.array(np.arange(rows.num_rows, dtype=np.int64) // size)
        table = pa.Table.from_arrays([*rows.select(schema.names).columns, slices],
                                     names=[*(f"c{i}" for i in range(len(schema))), "slice"])
        index = {name: f"c{i}" for i, name in enumerate(schema.names)}
        try:
            got = table.group_by("slice", use_threads=False).aggregate(
                [(index[c], how, *opts) for c, how, *opts in aggs])
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        values = [got.column(f"{index[c]}_{how}").to_pylist() for c, how, *_ in aggs]
        for row, g in enumerate(got.column("slice").to_pylist()):
            stats = out[g]
            for k, c in enumerate(exact):
                lo, hi = values[k][row], values[len(exact) + k][row]
                if lo is not None:
                    stats.mins[c], stats.maxs[c] = lo, hi
            for k, f in enumerate(schema):
                stats.nulls[f.name] = values[2 * len(exact) + k][row]
        return out

    def json(self, rows: int, key_bounds: list | None = None) -> str:
        mins, maxs = {}, {}
        for name in self.mins:
            lo, hi = self.mins[name], self.maxs[name]
            if isinstance(lo, str) and max(len(lo), len(hi)) > STAT_STRING_LIMIT:
                continue
            if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
                continue  # NaN / inf bounds are not JSON: the log would be unreadable
            mins[name], maxs[name] = _jsonable(lo), _jsonable(hi)
        out = {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": self.nulls}
        if key_bounds is not None:
            out[KEY_BOUNDS] = json.dumps(key_bounds)  # moved to the add's tags (NewFile.of)
        return json.dumps(out)


def _has_exact_stats(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date32(t)
            or pa.types.is_string(t))


def _jsonable(value):
    return value.isoformat() if hasattr(value, "isoformat") else value
