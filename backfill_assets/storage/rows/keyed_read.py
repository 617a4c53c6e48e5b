"""The live rows of given keys at a table version, reading only the row groups that can hold
them.

Why: a read by vnode (``read_version(vnodes=...)``, delta-rs' ``scan`` with a vnode
predicate) keeps whole vnodes, and a barrier's 1,000 changed keys hash to nearly all of 256
vnodes: the join index's 20M rows were read to keep its 20,000 (docs/JOINS.md, "Measured").
The platform's files are sorted by (vnode, key), so with small row groups
(``write.ROW_GROUP_ROWS_PROPERTY``) each group covers a narrow slice of one vnode's keys, and
its Parquet min/max statistics say which keys it cannot hold. So: files pruned by the log's
statistics (``prune.keys_by_file``), then row groups by their footer's statistics (footers
cached per file: files are immutable), only the groups left read, the file's deletion vector
applied, and the rows filtered to exactly the keys.

The group test is a superset test, never a miss: the keys' leading column is ranked among its
distinct values, a group's [min, max] becomes the rank range [r_lo, r_hi) it may hold, and the
group is read when some key's (vnode, rank) lies in [(vnode min, r_lo), (vnode max, r_hi)):
every row of the group lies there, whatever the file's order. A group or file without usable
statistics (other engines' files, types whose statistics are not exact here) is read: correct,
just slower.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.netting import rows_by_keys
from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.delta.prune import VNODE, keys_by_file
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.scan import opened, shaped
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU

_THREADS = min(4, os.cpu_count() or 1)  # files read at once (pyarrow releases the GIL)
# footers kept: a 20M-row table of 4,096-row groups holds ~5,000 groups, ~3 MB of footers
_FOOTERS: LRU[tuple[str, int], _Footer] = LRU(
    4096, name="parquet footers (keyed reads)", weight=lambda f: f.weight,
    max_weight=256 << 20)


@dataclass
class _Footer:
    """One data file's Parquet footer and what the group test takes from it, per column."""

    metadata: object  # pyarrow.parquet.FileMetaData
    present: frozenset[str]  # physical column names
    starts: np.ndarray  # first physical row of each row group, then the file's row count
    bounds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def weight(self) -> int:
        return int(self.metadata.serialized_size) * 4

    def column_bounds(self, physical: str, kind: type) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """Per row group: min, max and whether both are known and of Python type ``kind``
        (statistics of another type, a binary for a string, are not compared)."""
        key = f"{physical}:{kind.__name__}"
        if key not in self.bounds:
            self.bounds[key] = _bounds(self.metadata, physical, kind)
        return self.bounds[key]


def _bounds(md, physical: str, kind: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    groups = md.num_row_groups
    lo, hi = [None] * groups, [None] * groups
    known = np.zeros(groups, dtype=bool)
    index = next((j for j in range(md.num_columns)
                  if md.row_group(0).column(j).path_in_schema == physical), None) \
        if groups else None
    for g in range(groups if index is not None else 0):
        stats = md.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            continue
        a, b = stats.min, stats.max
        if type(a) is kind and type(b) is kind:
            lo[g], hi[g], known[g] = a, b, True
    # an unknown bound is masked by ``known``; it only needs to compare with the keys
    fill = next((x for x in lo if x is not None), 0)
    lo = [fill if x is None else x for x in lo]
    hi = [fill if x is None else x for x in hi]
    try:
        return _array(lo, kind), _array(hi, kind), known
    except OverflowError:  # a uint64 past int64: compared as Python ints
        return np.array(lo, dtype=object), np.array(hi, dtype=object), known


def _array(values: list, kind: type) -> np.ndarray:
    return np.array(values, dtype=np.int64 if kind is int else object)


@dataclass(frozen=True)
class _Probe:
    """The keys as the group test searches them: the sorted distinct values of the leading
    key column, and each key's (vnode, rank) packed as vnode * len(values) + rank, sorted."""

    values: np.ndarray
    packed: np.ndarray
    kind: type | None  # the Python type of the leading column's values; None: never prunes
    by_vnode: bool

    @classmethod
    def of(cls, keys: pa.Table, lead: str) -> _Probe:
        column = keys.column(lead)
        kind = _kind(column.type)
        unique = pc.unique(column).sort() if kind is not None else pa.array([], column.type)
        values = _numpy(unique, kind)
        ranks = np.searchsorted(values, _numpy(column, kind)) if kind is not None \
            else np.zeros(keys.num_rows, np.int64)
        by_vnode = VNODE in keys.column_names
        packed = ranks.astype(np.int64)
        if by_vnode:
            vnodes = keys.column(VNODE).to_numpy(zero_copy_only=False).astype(np.int64)
            packed = vnodes * max(1, len(values)) + packed
        return cls(values, np.sort(packed), kind, by_vnode)

    def groups(self, footer: _Footer, physical: str | None, vnode_bounds) -> list[int]:
        """The row groups of ``footer`` whose statistics admit a key (all without them)."""
        count = len(footer.starts) - 1
        if self.kind is None or physical is None or physical not in footer.present:
            return list(range(count))
        lo, hi, known = footer.column_bounds(physical, self.kind)
        r_lo = np.searchsorted(self.values, lo, "left")
        r_hi = np.searchsorted(self.values, hi, "right")
        if self.by_vnode:
            v_lo, v_hi = vnode_bounds(footer, count)
            width = max(1, len(self.values))
            r_lo, r_hi = v_lo * width + r_lo, v_hi * width + r_hi
        first = np.searchsorted(self.packed, r_lo.astype(np.int64), "left")
        past = np.searchsorted(self.packed, r_hi.astype(np.int64), "left")
        return np.flatnonzero(~known | (first < past)).tolist()


def rows_of_keys(snap: TableVersion, key_names: Sequence[str], keys: pa.Table,
                 columns: Sequence[str] | None = None, *, threads: int = _THREADS
                 ) -> pa.Table:
    """The live rows of ``snap`` whose ``key_names`` columns equal a row of ``keys`` (a key
    with a null never matches; repeated keys read once), as ``columns`` (default all) of the
    table's schema, in no particular order. ``keys`` may carry a ``vnode`` column (the
    vnode of each key in this table): files and row groups are then pruned by it too, as a
    vnode-clustered table needs. ``key_names`` need not be the table's whole key (the join
    index is read by its join key): every row matching is returned."""
    schema = snap.arrow_schema
    out = list(columns) if columns is not None else schema.names
    read = list(dict.fromkeys([*out, *key_names]))
    pairs, probe = _planned(snap, key_names, keys)

    def one(pair: tuple[DataFile, pa.Table]) -> pa.Table:
        return _file_rows_of(snap, pair[0], read, key_names, pair[1], probe)

    if len(pairs) > 1 and threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(one, pairs))
    else:
        parts = [one(p) for p in pairs]
    shape = pa.schema([schema.field(c) for c in read])
    return pa.concat_tables([shape.empty_table(), *parts]).select(out)


def row_groups_read(snap: TableVersion, key_names: Sequence[str], keys: pa.Table
                    ) -> dict[str, list[int]]:
    """The row groups ``rows_of_keys`` opens for ``keys``, per file path: what a test or a
    benchmark reports (rows read), without reading a row."""
    pairs, probe = _planned(snap, key_names, keys)
    found = {}
    for f, _ in pairs:
        uri = snap.file_uri(f.path)
        fs, path = objects.filesystem(uri, snap.storage_options)
        with fs.open_input_file(path) as handle:
            footer = _footer(handle, uri, f)
            found[f.path] = _groups(snap, f, footer, key_names, probe)
    return found


def _planned(snap: TableVersion, key_names: Sequence[str], keys: pa.Table
             ) -> tuple[list[tuple[DataFile, pa.Table]], _Probe | None]:
    """The files that may hold a key, each with its keys, and the keys' group test."""
    snap.check_readable()
    wanted = _wanted(snap, key_names, keys)
    if not wanted.num_rows:
        return [], None
    return keys_by_file(snap.files, wanted, key_names), _Probe.of(wanted, key_names[0])


def _groups(snap: TableVersion, f: DataFile, footer: _Footer, key_names: Sequence[str],
            probe: _Probe) -> list[int]:
    lead = key_names[0]
    physical = None if lead in snap.partition_columns else snap.physical_names.get(lead, lead)
    return probe.groups(footer, physical, _vnodes_of(snap, f))


def _wanted(snap: TableVersion, key_names: Sequence[str], keys: pa.Table) -> pa.Table:
    """The keys as the table's types, without those holding a null, each once (with
    ``vnode`` when both ``keys`` and the table carry it)."""
    schema = snap.arrow_schema
    if not key_names:
        raise ValueError("rows_of_keys needs at least one key column")
    names = list(dict.fromkeys(key_names))
    if VNODE in keys.column_names and VNODE in schema.names and VNODE not in names:
        names.append(VNODE)
    table = pa.table({k: keys.column(k).cast(schema.field(k).type) for k in names})
    if table.num_rows:
        valid = None
        for k in names:
            ok = pc.is_valid(table.column(k))
            valid = ok if valid is None else pc.and_(valid, ok)
        table = table.filter(valid)
    return table.group_by(names, use_threads=False).aggregate([]).select(names)


def _file_rows_of(snap: TableVersion, f: DataFile, columns: list[str],
                  key_names: Sequence[str], mine: pa.Table, probe: _Probe) -> pa.Table:
    """The rows of ``f`` whose key is in ``mine``: only its row groups the statistics admit
    are read, its DV applied, then the exact filter."""
    import pyarrow.parquet as pq

    schema = snap.arrow_schema
    out = pa.schema([schema.field(c) for c in columns])
    parts = [c for c in columns if c in snap.partition_columns]
    physical = {c: snap.physical_names.get(c, c) for c in columns if c not in parts}
    uri = snap.file_uri(f.path)
    fs, path = objects.filesystem(uri, snap.storage_options)
    with fs.open_input_file(path) as handle:
        footer = _footer(handle, uri, f)
        groups = _groups(snap, f, footer, key_names, probe)
        if not groups:
            return out.empty_table()
        # coalesced ranges: one request per few groups on an object store; on a local disk
        # plain reads of the chosen groups cost less (docs/STORAGE.md, "Keyed reads")
        pf = pq.ParquetFile(handle, metadata=footer.metadata,
                            pre_buffer=not objects.is_local(uri))
        table = pf.read_row_groups(groups, columns=[p for p in physical.values()
                                                    if p in footer.present], use_threads=False)
    partition = pa.table({c: pa.array([f.partition_values.get(c)]).cast(schema.field(c).type)
                          for c in parts}) if parts else None
    rows = shaped(table, set(footer.present), physical, out, partition)
    if f.deletion_vector:
        rows = rows.filter(_live(snap, f, footer, groups))
    return _exactly(rows, mine, key_names)


def _exactly(rows: pa.Table, keys: pa.Table, key_names: Sequence[str]) -> pa.Table:
    """The rows whose key is one of ``keys`` (which hold no null): a set lookup for a single
    column, a join for several (one join per file cost 0.2 ms more than the lookup)."""
    if len(key_names) == 1:
        name = key_names[0]
        return rows.filter(pc.is_in(rows.column(name), value_set=keys.column(name)))
    return rows_by_keys(rows, keys, key_names, "left semi")


def _footer(handle, uri: str, f: DataFile) -> _Footer:
    """The file's footer, read once per process (files never change: keyed by uri and size),
    its row count checked against the log at every use."""
    key = (uri, int(f.size or 0))
    footer = _FOOTERS.get(key)
    if footer is None:
        pf, present = opened(handle, uri, f.num_records)
        md = pf.metadata
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        footer = _Footer(md, frozenset(present), np.concatenate([[0], np.cumsum(sizes)]))
        _FOOTERS.put(key, footer)
    elif f.num_records is not None and footer.metadata.num_rows != f.num_records:
        raise StorageMismatch(
            f"{uri} holds {footer.metadata.num_rows} rows but the Delta log records "
            f"{f.num_records}: the store is not what the log says; stop")
    return footer


def _vnodes_of(snap: TableVersion, f: DataFile):
    """Per row group of ``f``: the vnodes its rows lie between (its partition value, else its
    ``vnode`` statistics; unknown: every vnode)."""
    part = f.partition_values.get(VNODE) if VNODE in snap.partition_columns else None

    def bounds(footer: _Footer, count: int) -> tuple[np.ndarray, np.ndarray]:
        if part is not None:
            return np.full(count, int(part), np.int64), np.full(count, int(part), np.int64)
        lo, hi, known = footer.column_bounds(snap.physical_names.get(VNODE, VNODE), int)
        return (np.where(known, lo, np.iinfo(np.int32).min).astype(np.int64),
                np.where(known, hi, np.iinfo(np.int32).max).astype(np.int64))

    return bounds


def _live(snap: TableVersion, f: DataFile, footer: _Footer, groups: list[int]) -> pa.Array:
    """Keep-mask of the rows read from ``groups`` of ``f``: false where its DV deletes."""
    deleted = key_cache.CACHE.deleted_rows(
        snap.uri, dv.unique_id(f.deletion_vector),
        lambda: dv.load(snap.uri, f.deletion_vector, snap.storage_options))
    count = int(footer.starts[-1])
    if len(deleted) and deleted.max() >= count:
        raise StorageMismatch(f"a DV of {snap.file_uri(f.path)} names row {deleted.max()} of "
                              f"{count}: the DV belongs to another file")
    rows = np.concatenate([np.arange(footer.starts[g], footer.starts[g + 1]) for g in groups])
    gone = np.fromiter(deleted, dtype=np.int64, count=len(deleted))
    return pa.array(~np.isin(rows, gone))


def _kind(t: pa.DataType) -> type | None:
    """The Python type Parquet statistics of a column of type ``t`` come back as, for the
    types whose statistics are exact and ordered as the values (None: no pruning)."""
    if pa.types.is_integer(t):
        return int
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_date32(t):
        return dt.date
    if pa.types.is_decimal(t):
        return decimal.Decimal
    return None


def _numpy(values, kind: type | None) -> np.ndarray:
    """Key values as the group test searches them (int64, else Python objects)."""
    if kind is None:
        return np.zeros(0, np.int64)
    try:
        return _array(values.to_pylist(), kind)
    except OverflowError:  # a uint64 past int64
        return np.array(values.to_pylist(), dtype=object)
