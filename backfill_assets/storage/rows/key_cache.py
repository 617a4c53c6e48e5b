"""Key columns of data files kept in memory between barriers of one warm process.

A small barrier must find where each changed key lives. Reading the key columns of every file
whose statistics admit a changed key costs what the table holds, not what changed: files are
clustered by (vnode, key) and keys are spread over all vnodes, so a few hundred changed keys
meet nearly every file. But a data file never changes once written (Delta only adds files and
deletion vectors), so its keys are the same at every barrier: a warm process (the continuous
follower, a benchmark's repeated barriers) keeps them, per file, and a lookup becomes a binary
search per changed key (single integer keys) or a hash join against the kept keys (others).

What is cached is immutable only: a file's keys (in file order) are keyed by table, path, size
and row count, and a deletion vector's rows by its unique id. Which rows are deleted is decided
at each lookup from the file's CURRENT descriptor, so a DV that grew is always honoured. The
cache is bounded by bytes (least recently used first out, ``set_limit`` / the setting
``BACKFILL_KEY_CACHE_MIB``), and the files of a table that are no longer live (compaction
removed them) leave it at the next lookup of that table. The first barrier after a process
starts pays the reads, except for files this process wrote itself (``remember_written``: a bulk
step's files in threads here, a small barrier's new file), whose keys it held as it wrote them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.storage.store.lru import LRU

DEFAULT_LIMIT_BYTES = 512 << 20
# what the cache keeps per key of a single integer pk (8 bytes sorted, 4 for its row); other
# keys take more, so for them the estimate only errs towards caching
CACHED_BYTES_PER_KEY = 12
_DVS_KEPT = 4096  # decoded deletion vectors kept
_ROW = "__bf_row"


@dataclass(frozen=True)
class FileKeys:
    """One file's key columns. Single integer keys are also kept sorted (``sorted_keys`` with
    the file row of each in ``order``): a lookup is then ``searchsorted``, independent of the
    file's size; other keys are probed by a hash join on ``keys``."""

    keys: pa.Table | None  # key columns in file order (None on the sorted path)
    sorted_keys: np.ndarray | None
    order: np.ndarray | None

    @classmethod
    def of(cls, keys: pa.Table) -> FileKeys:
        col = keys.column(0) if keys.num_columns == 1 else None
        if col is not None and pa.types.is_integer(col.type) and col.null_count == 0:
            values = col.to_numpy()
            order = np.argsort(values, kind="stable")
            small = np.int32 if len(values) < 2**31 else np.int64
            return cls(None, values[order], order.astype(small))
        return cls(keys, None, None)

    @property
    def nbytes(self) -> int:
        if self.keys is not None:
            return self.keys.nbytes
        return int(self.sorted_keys.nbytes + self.order.nbytes)

    def rows_of(self, wanted: pa.Table, key_names: Sequence[str],
                types: Sequence[pa.DataType]) -> tuple[np.ndarray, pa.Table]:
        """File rows (ascending) whose key is one of ``wanted`` (unique keys), and those keys
        (key columns, aligned with the rows)."""
        if self.sorted_keys is not None:
            w = np.unique(wanted.column(key_names[0]).cast(types[0]).to_numpy())
            lo = np.searchsorted(self.sorted_keys, w, "left")
            hi = np.searchsorted(self.sorted_keys, w, "right")
            counts = hi - lo
            total = int(counts.sum())
            starts = np.repeat(lo, counts)
            at = starts + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))
            rows = self.order[at].astype(np.int64)
            by_row = np.argsort(rows, kind="stable")
            values = pa.array(self.sorted_keys[at][by_row], types[0])
            return rows[by_row], pa.table({key_names[0]: values})
        if self.keys.num_columns == 1:  # a set lookup: no join plan per file and barrier
            return probe(self.keys, wanted, key_names, types)
        indexed = self.keys.append_column(_ROW, pa.array(np.arange(self.keys.num_rows)))
        probed = pa.table({k: wanted.column(k).cast(t) for k, t in zip(key_names, types,
                                                                        strict=True)})
        hit = indexed.join(probed, list(key_names), join_type="inner", use_threads=False)
        hit = hit.sort_by(_ROW)
        return hit.column(_ROW).to_numpy(), hit.select(list(key_names))


def probe(keys: pa.Table, wanted: pa.Table, key_names: Sequence[str],
          types: Sequence[pa.DataType]) -> tuple[np.ndarray, pa.Table]:
    """``FileKeys.rows_of`` for keys read once and dropped (a lookup that reads past the
    cache): one hash probe of the file's keys against ``wanted``, building no index, so a
    thread holds the key column and a bitmap, not three more arrays of its length."""
    if keys.num_columns > 1:
        return FileKeys(keys, None, None).rows_of(wanted, key_names, types)
    column = keys.column(0)
    value_set = pc.unique(wanted.column(key_names[0]).cast(types[0]).combine_chunks())
    # a null key matches nothing, as in a join
    hit = pc.indices_nonzero(pc.is_in(column, value_set=value_set, skip_nulls=True))
    return (hit.to_numpy(zero_copy_only=False).astype(np.int64),
            pa.table({key_names[0]: column.take(hit).cast(types[0])}))


class KeyCache:
    """Bytes-bounded LRU of ``FileKeys`` per (table, file), plus decoded DVs per unique id."""

    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self._files: LRU[tuple, FileKeys] = LRU(None, name="file keys",
                                                 weight=lambda keys: keys.nbytes,
                                                 max_weight=limit_bytes)
        self._dvs: LRU[tuple, object] = LRU(_DVS_KEPT, name="decoded deletion vectors")

    @property
    def limit(self) -> int:
        return self._files.max_weight or 0

    def file_keys(self, table: str, path: str, size: int, rows: int | None,
                  key_names: Sequence[str], read: Callable[[], pa.Table]) -> FileKeys:
        """The keys of one file, read by ``read`` (key columns, file order) on a miss."""
        key = (table, path, size, rows, tuple(key_names))
        with self._files.lock:
            found = self._files.get(key)
            if found is not None:
                return found
        entry = FileKeys.of(read())
        with self._files.lock:
            if entry.nbytes <= self.limit:  # kept unless another thread kept it first
                self._files.put(key, entry, replaces=lambda _: False)
        return entry

    def remember_written(self, table: str, files: Sequence[tuple[str, int, int]],
                         keys: pa.Table) -> None:
        """Files this process just wrote to ``table`` ((path, size, rows) each, in the order
        written) and their keys (key columns of every file's rows, one file after the other,
        file order, the table's types): kept as a read of them would keep them, so the next
        lookup reads none of them back: otherwise the first small barrier after a bulk step
        reads every MV file's keys, most of that barrier's cost. The caller asks ``fits`` of
        the table's rows first, as the lookup will."""
        names, start = tuple(keys.column_names), 0
        for path, size, rows in files:
            entry = FileKeys.of(keys.slice(start, rows))
            start += rows
            if entry.nbytes <= self.limit:
                self._files.put((table, path, size, rows, names), entry)

    def fits(self, rows: int) -> bool:
        """Whether the keys of a table of ``rows`` rows are kept here: a lookup in a larger
        table reads past the cache (``keyed._held``)."""
        return rows * CACHED_BYTES_PER_KEY <= self.limit

    def kept(self, table: str, path: str, size: int, rows: int | None,
             key_names: Sequence[str]) -> FileKeys | None:
        """The keys of that file, when they are kept (a lookup of it then reads nothing)."""
        return self._files.get((table, path, size, rows, tuple(key_names)), touch=False)

    def deleted_rows(self, table: str, unique_id: str, load: Callable[[], object]):
        """A DV's deleted rows (a pyroaring bitmap: callers must not change it)."""
        key = (table, unique_id)
        found = self._dvs.get(key)
        if found is not None:
            return found
        bitmap = load()
        self._dvs.put(key, bitmap)
        return bitmap

    def remember_deleted(self, table: str, unique_id: str, bitmap: object) -> None:
        """A DV this process just wrote: its rows, so neither the next lookup nor the next
        commit that extends it reads the DV file back (a small barrier's DVs are new for
        every file it touched, and each would be read twice a barrier). ``bitmap`` must not
        change afterwards."""
        self._dvs.put((table, unique_id), bitmap)

    def keep_live(self, table: str, live_paths: Iterable[str]) -> None:
        """Forget the files of ``table`` that are not in ``live_paths`` (removed files)."""
        live = set(live_paths)
        self._files.discard_where(lambda k: k[0] == table and k[1] not in live)

    def cached_paths(self, table: str) -> set[str]:
        return {k[1] for k in self._files.keys() if k[0] == table}

    def set_limit(self, limit_bytes: int) -> None:
        self._files.set_max_weight(limit_bytes)

    @property
    def hits(self) -> int:
        """Lookups of a file's keys that found them (since the last `lru.clear_all`)."""
        return self._files.hits

    @property
    def misses(self) -> int:
        """Lookups of a file's keys that had to read them."""
        return self._files.misses

    @property
    def bytes(self) -> int:
        return self._files.weight


CACHE = KeyCache()


def set_limit(limit_bytes: int) -> None:
    """The process-wide cache's bound in bytes (0 turns caching off)."""
    CACHE.set_limit(limit_bytes)
