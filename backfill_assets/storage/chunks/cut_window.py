"""no_shuffle's read window: the next few chunks' rows, held between barriers and kept at each
barrier's version by the change feed.

Why. Over an upstream whose files are not clustered by its pk (a copy-on-write writer's merges
leave every file spanning the key range), each no_shuffle barrier decodes about the whole table
to take one chunk: the rows read grow as the table times the barriers (table rows / chunk
rows barriers, each reading about the table), so time per row grows with the table. Caching
files does not help: the writer rewrites about two thirds of them a version. But the rows
themselves are known without reading them again: they are the rows of the version read, changed
by what the change feed says changed since.

How. A window holds the run's rows after its position ``lo`` up to a bound ``hi``, as of
``version``: ``WINDOW_CHUNKS`` chunks, read once (storage/chunks/window_scan.py when every file
must be read, else a shared cut with that many rows as its limit, storage/chunks/shared_cut.py)
and sorted by key (``key_ranks``). A later barrier at version
``v`` reads the feed of (``version``, v], keeps the change rows of the run's vnodes in
(position, ``hi``], nets them per key (``netting.net_with_prior``: the last change wins)
and takes its chunk: the window's next rows, without the keys that changed, plus the rows those
keys hold at ``v``. A barrier whose chunk would pass ``hi`` reads a new window. That is exact
because the window held every row of the version read in (``lo``, ``hi``], and the feed names
every key changed since.

Never a silent guess: the feed is checked against the window (every key it says existed is
held exactly once, and no key it touched without saying so is held: a writer that inserts a
second row for a held pk), and a window is read again when that fails, when the feed is gone
or changes the table's metadata, when it holds more change rows than a chunk, or when the
position left the window. A process keeps the window of its last few runs (``_KEPT``); a
crash loses it, and the next barrier reads one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.netting import CHANGE_TYPE, UPSERT_TYPES, VERSION, net_with_prior
from backfill_assets.core.errors import HistoryUnavailable
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.key_ranks import KeySpace, kth_smallest, packed_ranks
from backfill_assets.storage.chunks.key_search import after, key_at, within
from backfill_assets.storage.chunks.shared_cut import SharedCut, shared_cut
from backfill_assets.storage.chunks.window_scan import WINDOW_CAP, read_all
from backfill_assets.storage.delta.change_log import change_log
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.rows.change_feed import metadata_changed, read_change_range
from backfill_assets.storage.store.lru import LRU

# chunks a window holds: a barrier in this many reads the upstream's files (a quarter chunk
# more: the writer's deletes in the window must not leave its last chunk short)
WINDOW_CHUNKS = 4.25
WINDOW_MAX_ROWS = 5_000_000  # whole rows held at most, whatever the chunk size (memory)
_KEPT = 2  # windows a process keeps (one per run: vnodes, key, columns)


@dataclass
class _Window:
    """Rows of the run's vnodes in (``lo``, ``hi``] (``hi`` None: to the table's end) as of
    ``version``: ``rows`` sorted by key, ``ranks`` their keys in ``space`` (ascending), and
    ``changes``, the feed's rows since ``version`` inside the window past ``trimmed``."""

    version: int
    vnodes: tuple[int, ...]
    lo: Key | None
    hi: Key | None
    rows: pa.Table
    space: KeySpace
    ranks: np.ndarray
    changes: pa.Table | None = None
    trimmed: Key | None = None  # change rows at or before it were dropped
    last_read: int = 0  # change rows the last advance read
    lock: threading.Lock = field(default_factory=threading.Lock)


_WINDOWS: LRU[tuple, _Window] = LRU(_KEPT, name="shared-cut windows")


def windowed_cut(snap: TableVersion, key_order: KeyOrder, vnodes: Sequence[int], pos: Key | None,
                 limit: int, pick: Callable[[int], tuple[Sequence[DataFile], dict]],
                 read_rows: Callable[[DataFile], pa.Table], columns: Sequence[str]) -> SharedCut:
    """The shared cut of the first ``limit`` rows after ``pos`` (as ``shared_cut`` with
    ``read_rows``: ``held`` is the chunk), taken from this run's window when it is valid at
    ``snap`` and read into a new one when not. ``pick(n)``: the files (in floor order) and
    floors that hold the next ``n`` rows. ``rows_read`` is what this barrier decoded: the
    window's files when it read one, else the change rows."""
    key = (snap.uri, snap.table.metadata().id, tuple(sorted(vnodes)), key_order,
           tuple(columns))
    window = _WINDOWS.get(key)
    if window is not None:
        with window.lock:
            taken = _take_from(window, snap, key_order, pos, limit)
        if taken is not None:
            if taken.key is None:  # the run's last chunk: the window is done
                _forget(key)
            return taken
    window = None
    _forget(key)  # the old window's rows go before the new ones come (memory)
    size = max(limit, min(int(WINDOW_CHUNKS * limit), WINDOW_MAX_ROWS))
    files, floors = pick(size)
    read = None
    if files and len(files) == len(pick(sys.maxsize)[0]):  # every file can hold a window row
        read = read_all(files, key_order, vnodes, pos, size, limit, read_rows)
    if read is None:
        read = shared_cut(snap, files, key_order, vnodes, pos, size, floors, read_rows,
                          cap=WINDOW_CAP)
    if read.null_key or read.held is None:  # a null pk (the Spark path names it), no file
        return read
    rows_read, window = read.rows_read, _new_window(snap.version, tuple(sorted(vnodes)), pos,
                                                    read)
    del read  # its rows, unsorted: the window holds them sorted
    taken = None if window is None else _take_from(window, snap, key_order, pos, limit)
    if taken is None:  # keys that do not pack in 62 bits: the plain cut, every barrier
        return shared_cut(snap, files, key_order, vnodes, pos, limit, floors, read_rows)
    if taken.key is not None:
        _WINDOWS.put(key, window)
    return SharedCut(taken.key, taken.rows, held=taken.held, rows_read=rows_read,
                     window_rows=len(window.ranks))


def _forget(key: tuple) -> None:
    _WINDOWS.pop(key)


def _new_window(version: int, vnodes: tuple[int, ...], lo: Key | None,
                read: SharedCut) -> _Window | None:
    """The window of a cut's rows, sorted by the ranks it gave them."""
    if read.held_ranks is None or read.space is None:
        return None
    order = np.argsort(read.held_ranks, kind="stable")
    return _Window(version, vnodes, lo, read.key, read.held.take(pa.array(order)), read.space,
                   read.held_ranks[order], trimmed=lo)


def _take_from(w: _Window, snap: TableVersion, key_order: KeyOrder, pos: Key | None,
               limit: int) -> SharedCut | None:
    """This barrier's chunk from ``w`` brought to ``snap``'s version, or None when ``w``
    cannot give it (the module docstring lists when)."""
    if not _covers(w, key_order, pos) or snap.version < w.version:
        return None
    w.last_read = 0
    if snap.version > w.version and not _advance(w, snap, key_order, pos, limit):
        return None
    netted = net_with_prior(w.changes, key_order.names) if w.changes is not None else None
    removed = np.zeros(0, np.int64)
    if netted is not None:
        removed = _held_indices(w, netted, key_order)
        if removed is None:
            return None
    start = _first_after(w, key_order, pos)
    end = min(len(w.ranks), start + limit + len(removed))
    if 0 < end < len(w.ranks):  # every row of the last key taken
        end = int(np.searchsorted(w.ranks, w.ranks[end - 1], side="right"))
    top = w.hi if end == len(w.ranks) else key_at(w.rows, end - 1, key_order)
    kept = np.ones(end - start, bool)  # the window's rows in (pos, top], minus changed keys
    kept[removed[(removed >= start) & (removed < end)] - start] = False
    added = w.rows.schema.empty_table()
    if netted is not None and netted.after.num_rows:
        added = within(netted.after, key_order, pos, top).select(w.rows.schema.names) \
            .cast(w.rows.schema)
    if int(kept.sum()) + added.num_rows < limit:
        if top is not None:
            return None  # the chunk passes the window's end: read a new one
        chunk = pa.concat_tables([w.rows.slice(start, end - start).filter(pa.array(kept)),
                                  added])
        return SharedCut(None, chunk.num_rows, held=chunk, rows_read=w.last_read)
    cut, chunk = _limit_th(w, start, end, kept, added, key_order, limit)
    return SharedCut(cut, limit, held=chunk, rows_read=w.last_read)


def _covers(w: _Window, key_order: KeyOrder, pos: Key | None) -> bool:
    """Whether the rows after ``pos`` up to ``hi`` are all in ``w`` and its change rows (the
    window starts at or before ``pos``, which lies before its end)."""
    if pos is None:
        return w.trimmed is None
    if w.trimmed is not None and key_order.compare(pos, w.trimmed) < 0:
        return False
    return w.hi is None or key_order.compare(pos, w.hi) < 0


def _advance(w: _Window, snap: TableVersion, key_order: KeyOrder, pos: Key | None,
             limit: int) -> bool:
    """Add the feed's rows of (``w.version``, ``snap.version``] inside the window; False when
    the window must be read again instead."""
    first, last = w.version + 1, snap.version
    try:
        counted = [change_log(snap, v).rows for v in range(first, last + 1)]
        if all(n is not None for n in counted) and sum(counted) > limit:
            return False  # more change rows than a chunk: reading the files costs as much
        if metadata_changed(snap.uri, first, last, snap.storage_options, snap.table):
            return False
        raw = read_change_range(snap, w.version, last, w.rows.schema.names, w.vnodes,
                                 reuse=True)
    except HistoryUnavailable:
        return False
    if any(raw.column(c).null_count for c in key_order.names):
        return False  # a null pk: the files are read, where the cut stops on it (not dropped)
    w.last_read = raw.num_rows
    raw = within(raw, key_order, pos, w.hi)
    if w.changes is not None:
        raw = pa.concat_tables([within(w.changes, key_order, pos, w.hi), raw])
    if raw.num_rows > limit:
        return False
    w.changes, w.trimmed, w.version = raw, pos, last
    return True


def _held_indices(w: _Window, netted, key_order: KeyOrder) -> np.ndarray | None:
    """Where the window holds the keys the feed changed (their rows leave the chunk), or None
    when the feed and the window disagree. Per key, the rows held plus the feed's inserts
    minus its deletes must leave one row when its last change is an insert and none when a
    delete (a writer that inserts a second row for a pk fails this), and a key the feed says
    existed must be held exactly once."""
    names = key_order.names
    upsert = pc.is_in(w.changes.column(CHANGE_TYPE), pa.array(UPSERT_TYPES))
    version = w.changes.column(VERSION).to_numpy(zero_copy_only=False).astype(np.int64)
    flag = upsert.to_numpy(zero_copy_only=False).astype(np.int64)
    per_key = w.changes.select(names).append_column("delta", pa.array(2 * flag - 1)) \
        .append_column("last", pa.array(2 * version + flag)) \
        .group_by(names, use_threads=False).aggregate([("delta", "sum"), ("last", "max")])
    held = _counts(w, per_key.select(names))[1]
    final = held + per_key.column("delta_sum").to_numpy(zero_copy_only=False)
    if (final != per_key.column("last_max").to_numpy(zero_copy_only=False) % 2).any():
        return None
    start, count = _counts(w, netted.before.select(names))
    if (count != 1).any() or int(held.sum()) != len(count):
        return None
    return start


def _counts(w: _Window, keys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per key of ``keys``: the first index of it in the window's rows, and how many hold it."""
    ranks, inside = w.space.encode(keys)
    start = np.searchsorted(w.ranks, ranks, side="left")
    stop = np.searchsorted(w.ranks, ranks, side="right")
    return start, np.where(inside, stop - start, 0)


def _first_after(w: _Window, key_order: KeyOrder, pos: Key | None) -> int:
    """The index of the window's first row after ``pos``."""
    if pos is None:
        return 0
    at = pa.table({c: pa.array([v], w.rows.schema.field(c).type)
                   for c, v in zip(key_order.names, pos, strict=True)})
    ranks, inside = w.space.encode(at)
    if inside[0]:
        return int(np.searchsorted(w.ranks, ranks[0], side="right"))
    beyond = after(w.rows.select(key_order.names), key_order, pos)  # a key the window lacks
    mask = pc.fill_null(beyond, False).to_numpy(zero_copy_only=False)
    return int(np.argmax(mask)) if mask.any() else len(mask)


def _limit_th(w: _Window, start: int, end: int, kept: np.ndarray, added: pa.Table,
              key_order: KeyOrder, limit: int) -> tuple[Key, pa.Table]:
    """The ``limit``-th smallest key of the window's rows [start, end) still ``kept`` and the
    ``added`` rows, and every one of those rows at or before it: by the window's ranks, which
    hold the added keys too unless one has a value the window never saw (then by ranks of
    these rows alone)."""
    ranks, inside = w.space.encode(added.select(key_order.names))
    if not inside.all():
        rows = pa.concat_tables([w.rows.slice(start, end - start).filter(pa.array(kept)),
                                 added])
        fresh = packed_ranks(rows.select(key_order.names), key_order)
        if fresh is None:  # beyond 62 bits: a sort
            order = pc.sort_indices(rows, [(c.name, "descending" if c.descending else
                                            "ascending") for c in key_order.columns])
            cut = key_at(rows, order[limit - 1].as_py(), key_order)
            return cut, rows.filter(pc.invert(after(rows, key_order, cut)))
        kth, at = kth_smallest(fresh, limit)
        return key_at(rows, at, key_order), rows.filter(pa.array(fresh <= kth))
    held = w.ranks[start:end]
    kth = kth_smallest(np.concatenate([held[kept], ranks]), limit)[0]
    take_held, take_added = kept & (held <= kth), ranks <= kth
    at = np.flatnonzero(held == kth)
    cut = key_at(w.rows, start + int(at[0]), key_order) if len(at) else \
        key_at(added, int(np.flatnonzero(ranks == kth)[0]), key_order)
    return cut, pa.concat_tables([w.rows.slice(start, end - start).filter(pa.array(take_held)),
                                  added.filter(pa.array(take_added))])
