"""no_shuffle's shared cut: the key where a run's next ``limit`` rows end, from key columns alone.

A no_shuffle run's vnodes share one position, so its chunk is the first ``limit`` rows after it
across all of them. Cutting that from the read tasks' candidates takes a top-k over every
column in Spark (11.7 s of a 1M-row chunk's 28 s, round 16). Only the keys are needed
to rank the rows. The driver reads the candidate files' key columns (a few threads, DVs applied),
keeps the keys after the position, and folds them into the ``limit`` smallest whenever more
than ``_FOLD`` chunks' worth are held. The ``limit``-th key of them all is the cut. Each vnode's
chunk is then its rows in (position, cut], which the per-vnode Arrow chunk tasks read, project
and write without knowing of each other (``chunk_task.ChunkReader`` with ``ranged``).

Which files it reads: the run's files in the order of the least key each can hold after the
position (its floor, core/key_floor.py), until the ``limit`` smallest keys held all sort before
the next file's floor; no file after that can hold a key of the chunk. Over an upstream whose
files each span a leading column's values but a narrow range of the next (regions x ingested
ids), that is the files of the ids the chunk covers, not every file (round 19). The cut also
names the files that hold a row of the chunk, so the tasks read only those.

One read, when the chunk's tasks run in this process (``read_rows``, storage/bulk_write.py:
a local master). Over a writer's copy-on-write layout every file holds rows of every chunk, so
the key read above and the tasks' read of every column are two whole-table reads a barrier
(round 21: 1.2 s and 1.6 s of a 3.2 s barrier at 20M rows, composite pk). Given a reader of
whole rows, the cut holds the candidate rows themselves, folded as the keys are (every row at
the bound kept: a repeated pk must still reach the chunk's key check), and ``SharedCut.held``
is the chunk: each vnode's rows in (position, cut]. A cluster's tasks cannot share what the
driver holds, so there the cut reads keys and the tasks read the files again.

Memory: at most about ``_FOLD * limit`` keys plus ``_AHEAD`` files' keys read ahead,
whatever the remainder holds (over an upstream whose files span the whole key range, the
remainder is every file not yet passed). Time: after a fold, a file's keys past the largest
kept are dropped before they are held. A single integer key folds by ``numpy.partition``
(linear); other keys by a partition of packed ranks (``packed_ranks``), else an Arrow sort.
Sorting two chunks' keys at every fold cost 4-6 s of a 20M-row barrier (round 17).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.key_floor import Floor, admits_at_or_before, compare_floors
from backfill_assets.core.key_types import INT_RANGES
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.key_ranks import KeySpace, kth_smallest, packed_ranks
from backfill_assets.storage.chunks.key_search import after, key_at, within
from backfill_assets.storage.chunks.ordered import in_order
from backfill_assets.storage.delta.log import DataFile, Snapshot
from backfill_assets.storage.delta.prune import VNODE, vnode_span
from backfill_assets.storage.rows.keyed import read_keys

_THREADS = 4  # pyarrow's parquet reads and compute kernels release the GIL
# chunks' worth of keys held before they are folded into one; _EAGER once the read may stop
# soon (``shared_cut``): a fold tightens the bound that stops it
_FOLD, _EAGER = 4, 1.5
_AHEAD = 32  # files read ahead of the fold
_FOLD_ROWS, _AHEAD_ROWS = 2, 8  # the same when whole rows are held (they weigh more)
_CAP = 2.0  # chunks an estimated first bound leaves room for (``_SortedRanks.estimate``)


@dataclass(frozen=True)
class SharedCut:
    """Where a shared chunk ends: ``key`` is its last key (None: it is every row after the
    position, fewer than ``limit``); ``rows`` how many it holds; ``files`` the paths of the
    files holding a row of it. ``null_key``: a candidate's pk is null, so no cut is
    computed (the Spark path names the row)."""

    key: Key | None
    rows: int
    null_key: bool = False
    files: frozenset[str] = frozenset()
    held: pa.Table | None = None  # read with whole rows, a file or more: the chunk's rows
    rows_read: int = 0  # live rows of the files the cut read (what the barrier decoded)
    # with ``held``: its keys' ranks in ``space`` (row for row), when they pack (a window
    # sorts the rows by them, storage/cut_window.py)
    held_ranks: np.ndarray | None = None
    space: KeySpace | None = None
    window_rows: int = 0  # rows a window read at this barrier holds (storage/cut_window.py)


def shared_cut(snap: Snapshot, files: Sequence[DataFile], key_order: KeyOrder,
               vnodes: Sequence[int], pos: Key | None, limit: int,
               floors: Mapping[str, Floor] | None = None,
               read_rows: Callable[[DataFile], pa.Table] | None = None,
               estimate: bool = True, cap: float = _CAP) -> SharedCut:
    """The cut of the first ``limit`` live rows of ``vnodes`` after ``pos`` (None: from the
    start) among ``files`` (``seek.chunk_files``' pick for the run, in the order of
    ``floors``, the least key each can hold after ``pos``: they hold every such row; a file
    may also hold other vnodes' rows, which do not count). Without ``floors`` every file
    is read. ``read_rows``: a file's live rows, with the key and vnode columns; the cut then
    holds the chunk's rows (``held``: module docstring). ``cap``: the chunks of room an
    estimated first bound leaves (``_SortedRanks.estimate``)."""
    whole = read_rows is not None
    rank = _IntRanks(key_order, limit) if _one_integer(key_order) and not whole \
        else _SortedRanks(key_order, limit, whole, cap)
    run = set(vnodes)
    wanted = pa.array(sorted(run), snap.arrow_schema.field(VNODE).type)

    def candidates(f: DataFile):
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

    firsts: dict[str, Key] = {}  # per file read, its least key after the position
    rows_read = 0
    with ThreadPoolExecutor(_THREADS) as pool:
        for i, (f, got) in enumerate(in_order(pool, candidates, files,
                                               _AHEAD_ROWS if whole else _AHEAD)):
            if got is None:
                return SharedCut(None, 0, null_key=True)
            rows_read += f.live_records or 0
            nxt = floors.get(files[i + 1].path) if floors and i + 1 < len(files) else None
            # the read can stop only where the floor rises (files of one floor hold no key
            # before it, so they cannot lower the cut below it): only there is a fold, which
            # tightens the bound, worth its cost early
            here = floors.get(f.path) if floors else None
            if i == 0 and estimate and isinstance(rank, _SortedRanks) and nxt is not None \
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
    cut = rank.cut()
    if isinstance(rank, _SortedRanks) and rank.capped and (
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


def _one_integer(key_order: KeyOrder) -> bool:
    return len(key_order.columns) == 1 and key_order.columns[0].type in INT_RANGES


class _IntRanks:
    """One integer key as int64 ranks (negated when descending), folded by a partition."""

    def __init__(self, key_order: KeyOrder, limit: int):
        self.name, self.sign = key_order.columns[0].name, -1 if key_order.columns[0].descending \
            else 1
        self.limit, self.held, self.bound, self.rows = limit, [], None, 0

    def kept(self, keys: pa.Table, pos: Key | None) -> np.ndarray:
        ranks = keys.column(self.name).to_numpy().astype(np.int64, copy=False) * self.sign
        if pos is not None:
            ranks = ranks[ranks > int(pos[0]) * self.sign]
        bound = self.bound  # read once: the main thread may tighten it meanwhile
        return ranks if bound is None else ranks[ranks <= bound]

    def first(self, ranks: np.ndarray) -> Key | None:
        return (int(ranks.min()) * self.sign,) if len(ranks) else None

    def bound_key(self) -> Key | None:
        return None if self.bound is None else (self.bound * self.sign,)

    def add(self, ranks: np.ndarray, eager: bool = False) -> None:
        self.held.append(ranks)
        self.rows += len(ranks)
        if self.rows > (_EAGER if eager else _FOLD) * self.limit:
            kept = np.partition(np.concatenate(self.held), self.limit - 1)[:self.limit]
            self.held, self.bound, self.rows = [kept], int(kept.max()), self.limit

    def cut(self) -> SharedCut:
        ranks = np.concatenate(self.held) if self.held else np.zeros(0, np.int64)
        if len(ranks) < self.limit:
            return SharedCut(None, len(ranks))
        last = int(np.partition(ranks, self.limit - 1)[self.limit - 1])
        return SharedCut((last * self.sign,), self.limit)


class _SortedRanks:
    """Any key as Arrow key columns, folded by a sort in key order (``whole``: the tables
    held are whole rows, and a fold keeps every row at the bound)."""

    def __init__(self, key_order: KeyOrder, limit: int, whole: bool = False,
                 cap: float = _CAP):
        self.key_order, self.limit, self.held, self.bound = key_order, limit, [], None
        self.rows, self.whole, self.cap = 0, whole, cap
        self.ranked: tuple | None = None  # the held rows ranked by ``cut`` (whole rows)
        self.capped = False  # the bound is an estimate, not yet the k-th of ``limit`` rows
        self.sort_keys = [(c.name, "descending" if c.descending else "ascending")
                          for c in key_order.columns]

    def kept(self, keys: pa.Table, pos: Key | None) -> pa.Table:
        """The rows after ``pos`` and at or before the bound (read once: the main thread
        may tighten it meanwhile)."""
        return within(keys, self.key_order, pos, self.bound)

    def first(self, keys: pa.Table) -> Key | None:
        if not keys.num_rows:
            return None
        least = keys.take(pc.select_k_unstable(keys, 1, self.sort_keys))
        return self._key(least, 0)

    def bound_key(self) -> Key | None:
        return self.bound

    def estimate(self, first: pa.Table, file_rows: int, floor_rows: int) -> None:
        """Cap the rows held by an estimate, from the first file read, of the key below which
        ``_CAP`` chunks lie: over files of one floor (each spans the key range) the chunk's
        share of that file's rows after the position is its share of all of them. Without a
        cap every row after the position is held until folds tighten the bound (about five
        chunks of rows and four folds a barrier at 20M rows, round 22)."""
        after_pos = first.num_rows
        expected = after_pos / max(1, file_rows) * floor_rows  # rows after it, all files
        k = math.ceil(self.cap * self.limit * after_pos / max(1.0, expected))
        if after_pos and k < after_pos:
            keys = first.select(self.key_order.names)
            self.bound, self.capped = self._key(self._smallest_of(keys, k), k - 1), True

    def add(self, keys: pa.Table, eager: bool = False) -> None:
        self.held.append(keys)
        self.rows += keys.num_rows
        if self.rows > (_EAGER if eager else _FOLD_ROWS if self.whole else _FOLD) * self.limit:
            if self.whole and self._fold_whole():
                return
            kept = self._smallest()
            kth = self._key(kept, self.limit - 1)
            # the k-th of ``limit`` held rows bounds the cut; under an estimated cap only
            # once it is at or below the cap (rows past the cap were not held)
            if not self.capped or self.key_order.compare(kth, self.bound) <= 0:
                self.bound, self.capped = kth, False
            self.held = [self.held_upto(self.bound) if self.whole else kept]
            self.rows = self.held[0].num_rows

    def cut(self) -> SharedCut:
        rows = sum(t.num_rows for t in self.held)
        if rows < self.limit:
            return SharedCut(None, rows)
        if self.whole:  # ranked once here, reused by ``final``
            self.ranked = self._ranked()
            if self.ranked[1] is not None:
                return SharedCut(self._kth(self.ranked[0], self.ranked[1])[0], self.limit)
        return SharedCut(self._key(self._smallest(), self.limit - 1), self.limit)

    def _fold_whole(self) -> bool:
        """The fold of whole rows in one pass of packed ranks: the ``limit`` smallest rows
        and every row at the bound (or, under an estimated cap below them, the rows at or
        before the cap). False when the keys do not pack (the caller sorts instead)."""
        rows, ranks, space = self._ranked()
        if ranks is None:
            return False
        kth = self._kth(rows, ranks)
        if self.capped and self.key_order.compare(kth[0], self.bound) > 0:
            rows = rows.filter(pc.invert(after(rows, self.key_order, self.bound)))
        else:
            self.bound, self.capped = kth[0], False
            rows = rows.filter(pa.array(ranks <= kth[1]))
        self.held, self.rows = [rows], rows.num_rows
        return True

    def final(self, key: Key | None) -> tuple[pa.Table | None, np.ndarray | None,
                                              KeySpace | None]:
        """The rows held at or before ``key`` (the cut; None: all), with their ranks and
        space when the keys pack (one pass: no second sort or mask)."""
        if not self.held:
            return None, None, None
        rows, ranks, space = self.ranked or self._ranked()
        if ranks is None:
            return self.held_upto(key), None, None
        if key is not None:
            at = pa.table({c: pa.array([v], rows.schema.field(c).type)
                           for c, v in zip(self.key_order.names, key, strict=True)})
            keep = ranks <= space.encode(at)[0][0]
            rows, ranks = rows.filter(pa.array(keep)), ranks[keep]
        return rows, ranks, space

    def _ranked(self) -> tuple[pa.Table, np.ndarray | None, KeySpace | None]:
        rows = pa.concat_tables(self.held)
        space = KeySpace.of(rows.select(self.key_order.names), self.key_order)
        if space is None:
            return rows, None, None
        return rows, space.encode(rows.select(self.key_order.names))[0], space

    def _kth(self, rows: pa.Table, ranks: np.ndarray) -> tuple[Key, int]:
        """The ``limit``-th smallest key of ``rows`` and its rank."""
        kth, at = kth_smallest(ranks, self.limit)
        return self._key(rows, at), kth

    def held_upto(self, key: Key | None) -> pa.Table | None:
        """Every row held at or before ``key`` (None: all of them); None when no file was
        read."""
        if not self.held:
            return None
        rows = pa.concat_tables(self.held)
        return rows if key is None else rows.filter(pc.invert(after(rows, self.key_order,
                                                                     key)))

    def _smallest(self) -> pa.Table:
        """The ``limit`` smallest held keys (key columns only), the largest of them last."""
        return self._smallest_of(
            pa.concat_tables([t.select(self.key_order.names) for t in self.held]), self.limit)

    def _smallest_of(self, keys: pa.Table, k: int) -> pa.Table:
        """The ``k`` smallest of ``keys``, the largest of them last: by a partition of packed
        ranks when they fit (``packed_ranks``), else by a sort."""
        packed = packed_ranks(keys, self.key_order) if keys.num_rows > k else None
        if packed is None:
            return keys.take(pc.sort_indices(keys, self.sort_keys)[:k])
        # the (k - 1)-th lands in its sorted place, every smaller rank before it
        return keys.take(pa.array(np.argpartition(packed, k - 1)[:k]))

    def _key(self, keys: pa.Table, i: int) -> Key:
        return key_at(keys, i, self.key_order)
