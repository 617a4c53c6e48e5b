"""How a shared cut counts (storage/chunks/shared_cut.py): the ``limit`` smallest keys after the
position among those read so far, folded as more files are read, and what a cut found.

Memory: at most about ``FOLD * limit`` keys (``FOLD_ROWS`` when whole rows are held). Time:
after a fold, a file's keys past the largest kept are dropped before they are held. A single
integer key folds by ``numpy.partition`` (linear); other keys by a partition of packed ranks
(``packed_ranks``), else an Arrow sort: sorting two chunks' keys at every fold would cost more
than the read itself on a large table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.key_types import INT_RANGES
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunks.key_ranks import KeySpace, kth_smallest, packed_ranks
from backfill_assets.storage.chunks.key_search import after, key_at, within

# chunks' worth of keys held before they are folded into one; EAGER once the read may stop
# soon (``shared_cut``): a fold tightens the bound that stops it
FOLD, EAGER = 4, 1.5
FOLD_ROWS = 2  # the same when whole rows are held (they weigh more)
CAP = 2.0  # chunks an estimated first bound leaves room for (``SortedRanks.estimate``)


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
    # sorts the rows by them, storage/chunks/cut_window.py)
    held_ranks: np.ndarray | None = None
    space: KeySpace | None = None
    window_rows: int = 0  # rows a window read at this barrier holds (storage/chunks/cut_window.py)


def one_integer(key_order: KeyOrder) -> bool:
    return len(key_order.columns) == 1 and key_order.columns[0].type in INT_RANGES


class IntRanks:
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
        if self.rows > (EAGER if eager else FOLD) * self.limit:
            kept = np.partition(np.concatenate(self.held), self.limit - 1)[:self.limit]
            self.held, self.bound, self.rows = [kept], int(kept.max()), self.limit

    def cut(self) -> SharedCut:
        ranks = np.concatenate(self.held) if self.held else np.zeros(0, np.int64)
        if len(ranks) < self.limit:
            return SharedCut(None, len(ranks))
        last = int(np.partition(ranks, self.limit - 1)[self.limit - 1])
        return SharedCut((last * self.sign,), self.limit)


class SortedRanks:
    """Any key as Arrow key columns, folded by a sort in key order (``whole``: the tables
    held are whole rows, and a fold keeps every row at the bound)."""

    def __init__(self, key_order: KeyOrder, limit: int, whole: bool = False,
                 cap: float = CAP):
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
        ``CAP`` chunks lie: over files of one floor (each spans the key range) the chunk's
        share of that file's rows after the position is its share of all of them. Without a
        cap every row after the position is held until folds tighten the bound (several
        chunks of rows and several folds a barrier on a large table)."""
        after_pos = first.num_rows
        expected = after_pos / max(1, file_rows) * floor_rows  # rows after it, all files
        k = math.ceil(self.cap * self.limit * after_pos / max(1.0, expected))
        if after_pos and k < after_pos:
            keys = first.select(self.key_order.names)
            self.bound, self.capped = self._key(self._smallest_of(keys, k), k - 1), True

    def add(self, keys: pa.Table, eager: bool = False) -> None:
        self.held.append(keys)
        self.rows += keys.num_rows
        if self.rows > (EAGER if eager else FOLD_ROWS if self.whole else FOLD) * self.limit:
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
