"""How no_shuffle's window (storage/cut_window.py) is read when every file must be read.

Over a writer's copy-on-write layout each file spans the key range, so every file can hold a
row of the window and there is nothing to seek. A shared cut (storage/shared_cut.py) would
still hold rows until folds tighten its bound: at 20M rows its folds of whole rows (packed
ranks over six to eight million rows, then a filter) took 2-3 s of a 5 s window read. Here the
bound is estimated up front from a sample of the files (the largest), and each file keeps its
rows in (position, bound] as the readers read it. The rows held are then ranked once.

Exact either way: the window is every row under its bound, whatever the bound. A bound
estimated too tight (fewer rows than a chunk under it) hands the read to the exact cut; one
estimated too loose is cut to the window's size after the read, or, past ``_MOST`` windows
held, hands the read to the exact cut, which folds as it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.key_ranks import KeySpace, kth_smallest, packed_ranks
from backfill_assets.storage.key_search import after, key_at
from backfill_assets.storage.log import DataFile
from backfill_assets.storage.ordered import in_order
from backfill_assets.storage.prune import VNODE, vnode_span
from backfill_assets.storage.shared_cut import SharedCut
from backfill_assets.storage.window_spill import SPILL_MAX_BYTES, Spill

# room an estimated bound leaves, in windows: from the sample's tens of thousands of keys the
# estimate is within a few percent over files that each span the key range
WINDOW_CAP = 1.25
_SAMPLE_FILES = 8  # the largest files, read first: the bound is estimated from their rows
_THREADS = 4  # parquet reads and compute kernels release the GIL
_MOST = 3  # windows of rows held at most while reading (a bound estimated too loose)
_AHEAD = 16  # files read ahead of the one being kept
_BUCKETS = 100  # a spill's buckets at most: larger buckets past that (files, masks per row)
# a rest this many windows past the bound is read with it: a last window of a few rows would
# cost a read of every file (at 20M rows, 1.75 s for the last million)
_TAIL = 0.5


def read_all(files: Sequence[DataFile], key_order: KeyOrder, vnodes: Sequence[int],
             pos: Key | None, size: int, limit: int,
             read_rows: Callable[[DataFile], pa.Table]) -> tuple[SharedCut, Spill | None] | None:
    """A window read when every file must be read anyway (each can hold a row of it: the
    writer's layout): bucket bounds are estimated up front from a sample of files, and each
    file splits its rows after ``pos`` by them as it is read, in the readers' threads. The
    first bucket is the window (its cut's ``held``); the others go to a spill on local disk
    (storage/window_spill.py) for the windows after it, so the table is decoded once. No
    fold, no second pass. None when the estimate left fewer than ``limit`` rows in the
    window (the exact cut then reads)."""
    run = set(vnodes)
    wanted = pa.array(sorted(run), pa.int32())

    def run_rows(f: DataFile, bounds: Sequence[Key | None]) -> list[pa.Table]:
        rows = read_rows(f)
        lo_v, hi_v = vnode_span(f)
        if lo_v is None or hi_v is None or not all(v in run for v in range(lo_v, hi_v + 1)):
            rows = rows.filter(pc.is_in(rows.column(VNODE), value_set=wanted.cast(
                rows.schema.field(VNODE).type)))
        if any(rows.column(c).null_count for c in key_order.names):
            raise _NullKey  # before the key masks, which would drop the row unseen
        return _split(rows, key_order, pos, bounds)

    by_size = sorted(files, key=lambda f: -(f.live_records or 0))
    sample, rest = by_size[:_SAMPLE_FILES], by_size[_SAMPLE_FILES:]
    read = sum(f.live_records or 0 for f in files)
    pool, spill = ThreadPoolExecutor(_THREADS), None
    try:
        first = pa.concat_tables([p[0] for p in pool.map(lambda f: run_rows(f, [None]),
                                                         sample)])
        bounds, step = _bounds(first, sum(f.live_records or 0 for f in sample), read, size,
                               key_order)
        pieces = _split(first, key_order, None, bounds)
        if len(bounds) > 1:
            spill = Spill(first.schema, bounds[1:])
            spill.write(pieces[1:])
        held_pieces, held = [pieces[0]], pieces[0].num_rows
        for _, got in in_order(pool, lambda f: run_rows(f, bounds), rest, _AHEAD):
            held_pieces.append(got[0])
            held += got[0].num_rows
            if spill is not None:
                spill.write(got[1:])
            if held > _MOST * size:  # the sample misled: the exact cut folds as it reads
                return _discarded(spill)
    except _NullKey:  # no cut: the Spark path names the row
        return SharedCut(None, 0, null_key=True, rows_read=read), _discarded(spill)
    except BaseException:
        _discarded(spill)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    hi, rows = bounds[0], pa.concat_tables(held_pieces)
    if spill is not None:
        spill.seal()
        if any(b.rows > _MOST * step for b in spill.buckets):  # a bucket too large to load
            spill = _discarded(spill)
    if rows.num_rows < limit and hi is not None and spill is None:  # (a spill: loaded next)
        return None
    space = KeySpace.of(rows.select(key_order.names), key_order)
    if space is None:
        return _discarded(spill)
    ranks = space.encode(rows.select(key_order.names))[0]
    if rows.num_rows > 2 * size:  # the estimate was loose: keep the window's size
        spill = _discarded(spill)  # (the rows past the new bound are no bucket's)
        kth, at = kth_smallest(ranks, size)
        hi = key_at(rows, at, key_order)
        keep = ranks <= kth
        rows, ranks = rows.filter(pa.array(keep)), ranks[keep]
    spilled = 0 if spill is None else spill.rows
    return SharedCut(hi, rows.num_rows, held=rows, rows_read=read, held_ranks=ranks,
                     space=space, window_rows=rows.num_rows + spilled), spill


class _NullKey(Exception):
    """A row of the run whose pk is null: the read stops (no cut is computed for it)."""


def _discarded(spill: Spill | None) -> None:
    if spill is not None:
        spill.discard()


def _split(rows: pa.Table, key_order: KeyOrder, pos: Key | None,
           bounds: Sequence[Key | None]) -> list[pa.Table]:
    """``rows`` after ``pos`` by bucket: piece i holds the keys in (bound i-1, bound i] (the
    last bound None: to the end; rows past a last bound that is not None are dropped). One
    mask per bound (a bucket's bounds are few), then one filter per bucket."""
    if pos is None and list(bounds) == [None]:
        return [rows]
    ids = np.zeros(rows.num_rows, np.int16)
    for hi in (b for b in bounds if b is not None):
        ids += pc.fill_null(after(rows, key_order, hi), False).to_numpy(zero_copy_only=False)
    if pos is not None:
        ids[~pc.fill_null(after(rows, key_order, pos), False).to_numpy(zero_copy_only=False)] \
            = -1
    if len(bounds) == 1:
        return [rows.filter(pa.array(ids == 0))]
    return [rows.filter(pa.array(ids == i)) for i in range(len(bounds))]


def _bounds(sample: pa.Table, sample_rows: int, total_rows: int, size: int,
            key_order: KeyOrder) -> tuple[list[Key | None], int]:
    """Bucket bounds from a sample of the files (their rows after the position, in the run),
    and the rows a spilled bucket is to hold: the window's bound (about ``WINDOW_CAP``
    windows of rows under it), then one a bucket further each (a window's rows, more when
    ``_BUCKETS`` of those would not reach the spill's room), up to the table's end (None:
    the rest, when it is less than ``_TAIL`` window past the last bound) or the spill's room
    (``SPILL_MAX_BYTES``: the rows past it are read again, later). [None]: every row fits the
    window."""
    expected = sample.num_rows / max(1, sample_rows) * total_rows
    if not sample.num_rows or expected <= (WINDOW_CAP + _TAIL) * size:
        return [None], size
    keys = sample.select(key_order.names)
    ranks = packed_ranks(keys, key_order)
    if ranks is None:
        return [None], size
    order = np.argsort(ranks, kind="stable")  # a sample: tens of thousands of keys
    room = SPILL_MAX_BYTES / max(1.0, sample.nbytes / sample.num_rows)  # rows the spill takes
    step = max(size, math.ceil(min(room, expected) / _BUCKETS))
    bounds: list[Key | None] = []
    count = WINDOW_CAP * size
    while count < expected - _TAIL * size:
        k = math.ceil(count * sample.num_rows / expected)
        if k >= sample.num_rows:
            break
        bounds.append(key_at(keys, int(order[k - 1]), key_order))
        count += step
        if count - WINDOW_CAP * size > room:
            return bounds, step
    return [*bounds, None], step
