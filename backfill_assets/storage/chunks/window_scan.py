"""How no_shuffle's window (storage/chunks/cut_window.py) is read when every file must be read.

Over a writer's copy-on-write layout each file spans the key range, so every file can hold a row
of the window and there is nothing to seek. A shared cut (storage/chunks/shared_cut.py) would
still hold rows until folds tighten its bound: on a large table its folds of whole rows (packed
ranks over several windows of rows, then a filter) cost about half of a window read. Here the
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

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.key_ranks import KeySpace, kth_smallest, packed_ranks
from backfill_assets.storage.chunks.key_search import key_at, within
from backfill_assets.storage.chunks.ordered import in_order
from backfill_assets.storage.chunks.shared_cut import SharedCut
from backfill_assets.storage.delta.log import DataFile
from backfill_assets.storage.delta.prune import VNODE, vnode_span

# room an estimated bound leaves, in windows: from the sample's tens of thousands of keys the
# estimate is within a few percent over files that each span the key range
WINDOW_CAP = 1.25
_SAMPLE_FILES = 8  # the largest files, read first: the bound is estimated from their rows
_THREADS = 4  # parquet reads and compute kernels release the GIL
_MOST = 3  # windows of rows held at most while reading (a bound estimated too loose)
_AHEAD = 16  # files read ahead of the one being kept
# a rest this many windows past the bound is read with it: a last window of a few rows would
# cost a read of every file for a few rows
_TAIL = 0.5


def read_all(files: Sequence[DataFile], key_order: KeyOrder, vnodes: Sequence[int],
              pos: Key | None, size: int, limit: int,
              read_rows: Callable[[DataFile], pa.Table]) -> SharedCut | None:
    """A window read when every file must be read anyway (each can hold a row of it: the
    writer's layout): the bound is estimated up front from a sample of files, and each file
    keeps its rows in (``pos``, bound] as it is read, in the readers' threads. No fold, no
    second pass (a shared cut's folds of whole rows cost about half of a window read). None when
    the estimate left fewer than ``limit`` rows (the exact cut then reads)."""
    run = set(vnodes)
    wanted = pa.array(sorted(run), pa.int32())

    def run_rows(f: DataFile, hi: Key | None) -> pa.Table:
        rows = read_rows(f)
        lo_v, hi_v = vnode_span(f)
        if lo_v is None or hi_v is None or not all(v in run for v in range(lo_v, hi_v + 1)):
            rows = rows.filter(pc.is_in(rows.column(VNODE), value_set=wanted.cast(
                rows.schema.field(VNODE).type)))
        if any(rows.column(c).null_count for c in key_order.names):
            raise _NullKey  # before the key masks, which would drop the row unseen
        return within(rows, key_order, pos, hi)

    by_size = sorted(files, key=lambda f: -(f.live_records or 0))
    sample, rest = by_size[:_SAMPLE_FILES], by_size[_SAMPLE_FILES:]
    read = sum(f.live_records or 0 for f in files)
    pool = ThreadPoolExecutor(_THREADS)
    try:
        first = pa.concat_tables(list(pool.map(lambda f: run_rows(f, None), sample)))
        hi = _estimate(first, sum(f.live_records or 0 for f in sample),
                       sum(f.live_records or 0 for f in files), size, key_order)
        pieces = [within(first, key_order, None, hi)]
        held = pieces[0].num_rows
        for _, got in in_order(pool, lambda f: run_rows(f, hi), rest, _AHEAD):
            pieces.append(got)
            held += got.num_rows
            if held > _MOST * size:  # the sample misled: the exact cut folds as it reads
                return None
    except _NullKey:  # no cut: the Spark path names the row
        return SharedCut(None, 0, null_key=True, rows_read=read)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    rows = pa.concat_tables(pieces)
    if rows.num_rows < limit and hi is not None:
        return None
    space = KeySpace.of(rows.select(key_order.names), key_order)
    if space is None:
        return None
    ranks = space.encode(rows.select(key_order.names))[0]
    if rows.num_rows > 2 * size:  # the estimate was loose: keep the window's size
        kth, at = kth_smallest(ranks, size)
        hi = key_at(rows, at, key_order)
        keep = ranks <= kth
        rows, ranks = rows.filter(pa.array(keep)), ranks[keep]
    return SharedCut(hi, rows.num_rows, held=rows, rows_read=read, held_ranks=ranks,
                     space=space)


class _NullKey(Exception):
    """A row of the run whose pk is null: the read stops (no cut is computed for it)."""


def _estimate(sample: pa.Table, sample_rows: int, total_rows: int, size: int,
              key_order: KeyOrder) -> Key | None:
    """The key under which about ``WINDOW_CAP`` windows of rows lie, from a sample of the
    files (their rows after the position, in the run): None when that is every row, or
    leaves less than ``_TAIL`` window after it (that is read with this window)."""
    expected = sample.num_rows / max(1, sample_rows) * total_rows
    if not sample.num_rows or expected <= (WINDOW_CAP + _TAIL) * size:
        return None
    k = math.ceil(WINDOW_CAP * size * sample.num_rows / max(1.0, expected))
    if k >= sample.num_rows:
        return None
    keys = sample.select(key_order.names)
    ranks = packed_ranks(keys, key_order)
    if ranks is None:
        return None
    return key_at(keys, kth_smallest(ranks, k)[1], key_order)
