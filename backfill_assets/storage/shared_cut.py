"""no_shuffle's shared cut: the key where a run's next ``limit`` rows end, from key columns alone.

A no_shuffle run's vnodes share one position, so its chunk is the first ``limit`` rows after it
across all of them. Cutting that from the read tasks' candidates takes a top-k over every
column in Spark (11.7 s of a 1M-row chunk's 28 s, round 16). Only the keys are needed
to rank the rows. The driver reads the candidate files' key columns (a few threads, DVs applied),
keeps the keys after the position and, file by file, at most ``limit`` of the smallest. The
``limit``-th key of them all is the cut. Each vnode's chunk is then its rows in (position,
cut], which the per-vnode Arrow chunk tasks read, project and write without knowing of each
other (``chunk_task.ChunkReader`` with ``ranged``).

Memory: the keys kept are at most about ``2 * limit`` plus one file per thread, whatever the
remainder holds (over an upstream whose files span the whole key range, the remainder is every
file not yet passed).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.key_search import after
from backfill_assets.storage.keyed import read_keys
from backfill_assets.storage.log import DataFile, Snapshot
from backfill_assets.storage.prune import VNODE

_THREADS = 4  # pyarrow's parquet reads and compute kernels release the GIL


@dataclass(frozen=True)
class SharedCut:
    """Where a shared chunk ends: ``key`` is its last key (None: it is every row after the
    position, fewer than ``limit``); ``rows`` how many it holds. ``null_key``: a
    candidate's pk is null, so no cut is computed (the Spark path names the row)."""

    key: Key | None
    rows: int
    null_key: bool = False


def shared_cut(snap: Snapshot, files: Sequence[DataFile], key_order: KeyOrder,
               vnodes: Sequence[int], pos: Key | None, limit: int) -> SharedCut:
    """The cut of the first ``limit`` live rows of ``vnodes`` after ``pos`` (None: from the
    start) among ``files`` (``seek.chunk_files``' pick for the run: they hold every such
    row; a file may also hold other vnodes' rows, which do not count)."""
    sort_keys = _sort_keys(key_order)
    run = pa.array(sorted(vnodes), snap.arrow_schema.field(VNODE).type)

    def smallest(f: DataFile) -> pa.Table | None:
        keys = read_keys(snap, f, [*key_order.names, VNODE], live=True)
        keys = keys.filter(pc.is_in(keys.column(VNODE), value_set=run)).select(key_order.names)
        if any(keys.column(c).null_count for c in key_order.names):
            return None
        if pos is not None:
            keys = keys.filter(after(keys, key_order, pos))
        return _top(keys, limit, sort_keys)

    kept: list[pa.Table] = []
    held = 0
    with ThreadPoolExecutor(_THREADS) as pool:
        for keys in pool.map(smallest, files):
            if keys is None:
                return SharedCut(None, 0, null_key=True)
            kept.append(keys)
            held += keys.num_rows
            if held > 2 * limit:  # fold: memory stays about two chunks of keys
                kept = [_top(pa.concat_tables(kept), limit, sort_keys)]
                held = kept[0].num_rows
    if held < limit:  # no file was cut short (``_top`` keeps ``limit`` of a larger one)
        return SharedCut(None, held)
    top = _top(pa.concat_tables(kept), limit, sort_keys, always=True)
    return SharedCut(tuple(top.column(c)[limit - 1].as_py() for c in key_order.names), limit)


def _top(keys: pa.Table, limit: int, sort_keys: list[tuple[str, str]],
         always: bool = False) -> pa.Table:
    """The ``limit`` smallest keys, sorted in key order (``keys`` as they are when there are
    no more, unless ``always``). A sort, not ``select_k_unstable``: its heap of ``limit``
    entries took 3.1 s to keep 1M of 1M keys, the sort 0.1 s."""
    if keys.num_rows <= limit and not always:
        return keys
    return keys.take(pc.sort_indices(keys, sort_keys)[:limit])


def _sort_keys(key_order: KeyOrder) -> list[tuple[str, str]]:
    """Key order as Arrow sort keys."""
    return [(c.name, "descending" if c.descending else "ascending") for c in key_order.columns]
