"""no_shuffle's shared cut: the key where a run's next ``limit`` rows end, from key columns alone.

A no_shuffle run's vnodes share one position, so its chunk is the first ``limit`` rows after it
across all of them. Cutting that from the read tasks' candidates takes a top-k over every
column in Spark, which moves every column of every candidate row. Only the keys are needed
to rank the rows. The driver reads the candidate files' key columns (a few threads, DVs applied),
keeps the keys after the position, and folds them into the ``limit`` smallest whenever more
than ``FOLD`` chunks' worth are held (cut_ranks.py). The ``limit``-th key of them all is the
cut. Each vnode's chunk is then its rows in (position, cut], which the per-vnode Arrow chunk
tasks read, project and write without knowing of each other (``chunk_task.ChunkReader`` with
``ranged``).

Which files it reads: the run's files in the order of the least key each can hold after the
position (its floor, core/key_floor.py), until the ``limit`` smallest keys held all sort before
the next file's floor; no file after that can hold a key of the chunk. Over an upstream whose
files each span a leading column's values but a narrow range of the next (regions x ingested
ids), that is the files of the ids the chunk covers, not every file. The cut also
names the files that hold a row of the chunk, so the tasks read only those.

One read, when the chunk's tasks run in this process (``read_rows``, storage/writes/bulk.py:
a local master). Over a writer's copy-on-write layout every file holds rows of every chunk, so
the key read above and the tasks' read of every column would be two whole-table reads a
barrier, most of its cost. Given a reader of
whole rows, the cut holds the candidate rows themselves, folded as the keys are (every row at
the bound kept: a repeated pk must still reach the chunk's key check), and ``SharedCut.held``
is the chunk: each vnode's rows in (position, cut]. A cluster's tasks cannot share what the
driver holds, so there the cut reads keys and the tasks read the files again.

Memory: at most about ``FOLD * limit`` keys plus ``_AHEAD`` files' keys read ahead,
whatever the remainder holds (over an upstream whose files span the whole key range, the
remainder is every file not yet passed); how the keys are folded: cut_ranks.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.key_floor import Floor, admits_at_or_before, compare_floors
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.cut_ranks import (
    CAP,
    IntRanks,
    SharedCut,
    SortedRanks,
    one_integer,
)
from backfill_assets.storage.chunks.ordered import in_order
from backfill_assets.storage.delta.log import DataFile, TableVersion
from backfill_assets.storage.delta.prune import VNODE, vnode_span
from backfill_assets.storage.rows.keyed import read_keys

_THREADS = 4  # pyarrow's parquet reads and compute kernels release the GIL
_AHEAD = 32  # files read ahead of the fold
_AHEAD_ROWS = 8  # the same when whole rows are held (they weigh more)


def shared_cut(snap: TableVersion, files: Sequence[DataFile], key_order: KeyOrder,
               vnodes: Sequence[int], pos: Key | None, limit: int,
               floors: Mapping[str, Floor] | None = None,
               read_rows: Callable[[DataFile], pa.Table] | None = None,
               estimate: bool = True, cap: float = CAP) -> SharedCut:
    """The cut of the first ``limit`` live rows of ``vnodes`` after ``pos`` (None: from the
    start) among ``files`` (``seek.chunk_files``' pick for the run, in the order of
    ``floors``, the least key each can hold after ``pos``: they hold every such row; a file
    may also hold other vnodes' rows, which do not count). Without ``floors`` every file
    is read. ``read_rows``: a file's live rows, with the key and vnode columns; the cut then
    holds the chunk's rows (``held``: module docstring). ``cap``: the chunks of room an
    estimated first bound leaves (``SortedRanks.estimate``)."""
    whole = read_rows is not None
    rank = IntRanks(key_order, limit) if one_integer(key_order) and not whole \
        else SortedRanks(key_order, limit, whole, cap)
    folded = _fold(files, floors, key_order, rank,
                   _candidates(snap, key_order, vnodes, pos, rank, read_rows), whole, estimate)
    if folded is None:
        return SharedCut(None, 0, null_key=True)
    firsts, rows_read = folded
    cut = rank.cut()
    if isinstance(rank, SortedRanks) and rank.capped and (
            cut.key is None or key_order.compare(cut.key, rank.bound) > 0):
        # fewer than ``limit`` rows lie under the estimated cap, and rows past it were not
        # held: the cut is done again without it (counted: both reads were paid)
        again = shared_cut(snap, files, key_order, vnodes, pos, limit, floors, read_rows,
                           estimate=False, cap=cap)
        return replace(again, rows_read=again.rows_read + rows_read)
    held = {p for p, k in firsts.items()
            if cut.key is None or key_order.compare(k, cut.key) <= 0}
    if whole:  # the rows at or before the cut, ranked in one pass
        rows, ranks, space = rank.final(cut.key)
        return SharedCut(cut.key, cut.rows, files=frozenset(held), held=rows,
                         rows_read=rows_read, held_ranks=ranks, space=space)
    return SharedCut(cut.key, cut.rows, files=frozenset(held), rows_read=rows_read)


def _candidates(snap: TableVersion, key_order: KeyOrder, vnodes: Sequence[int], pos: Key | None,
                rank: IntRanks | SortedRanks,
                read_rows: Callable[[DataFile], pa.Table] | None
                ) -> Callable[[DataFile], tuple[pa.Table, Key | None] | None]:
    """What a file gives the cut: its rows of the run's vnodes after ``pos`` as ``rank``
    keeps them, and the least of their keys; None when it holds a null pk."""
    whole = read_rows is not None
    run = set(vnodes)
    wanted = pa.array(sorted(run), snap.arrow_schema.field(VNODE).type)

    def candidates(f: DataFile) -> tuple[pa.Table, Key | None] | None:
        lo, hi = vnode_span(f)
        inside = lo is not None and hi is not None and all(v in run for v in range(lo, hi + 1))
        if read_rows is not None:
            keys = read_rows(f)
        else:  # the vnode column only where it filters: a third of the read of one int key
            keys = read_keys(snap, f, [*key_order.names, *(() if inside else (VNODE,))],
                             live=True)
        if not inside:
            keys = keys.filter(pc.is_in(keys.column(VNODE), value_set=wanted))
        if not whole:
            keys = keys.select(key_order.names)
        if any(keys.column(c).null_count for c in key_order.names):
            return None
        kept = rank.kept(keys, pos)
        return kept, rank.first(kept)

    return candidates


def _fold(files: Sequence[DataFile], floors: Mapping[str, Floor] | None, key_order: KeyOrder,
          rank: IntRanks | SortedRanks,
          candidates: Callable[[DataFile], tuple[pa.Table, Key | None] | None], whole: bool,
          estimate: bool) -> tuple[dict[str, Key], int] | None:
    """``files`` read in floor order (a few ahead, in threads) into ``rank`` until no file
    after the last one read can hold a key at or before its bound: per file read, its least
    key after the position, and the live rows read; None when a pk is null."""
    firsts: dict[str, Key] = {}
    rows_read = 0
    with ThreadPoolExecutor(_THREADS) as pool:
        for i, (f, got) in enumerate(in_order(pool, candidates, files,
                                               _AHEAD_ROWS if whole else _AHEAD)):
            if got is None:
                return None
            rows_read += f.live_records or 0
            nxt = floors.get(files[i + 1].path) if floors and i + 1 < len(files) else None
            # the read can stop only where the floor rises (files of one floor hold no key
            # before it, so they cannot lower the cut below it): only there is a fold, which
            # tightens the bound, worth its cost early
            here = floors.get(f.path) if floors else None
            if i == 0 and estimate and isinstance(rank, SortedRanks) and nxt is not None \
                    and here is not None and compare_floors(key_order, nxt, here) == 0:
                same = [g for g in files if floors.get(g.path) is not None
                        and compare_floors(key_order, floors[g.path], here) == 0]
                rank.estimate(got[0], f.live_records or 0,
                              sum(g.live_records or 0 for g in same))
            rank.add(got[0], eager=nxt is not None and here is not None
                     and compare_floors(key_order, nxt, here) > 0)
            if got[1] is not None:
                firsts[f.path] = got[1]
            bound = rank.bound_key()
            if nxt is not None and bound is not None \
                    and not admits_at_or_before(key_order, nxt, bound):
                break  # no file after this one holds a key at or before the cut
    return firsts, rows_read
