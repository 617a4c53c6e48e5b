"""Which files a snapshot chunk needs: a seek by the log's statistics, not a scan.

A chunked barrier reads, per vnode (or per run in no_shuffle), the next ``limit`` rows after a
position in key order. Reading every remaining row to sort them makes each barrier cost the
whole remainder; this module picks only the files that can hold those rows, from what the log
already records per file: the vnode span, the key bounds and the live row count.

Why the pick is exact. Files meeting the group's vnodes whose upper key bound is after the
position are taken in order of their lower key bound. After taking a prefix of that order, let
``cut`` be the lower bound of the next file: every row of the group with a key in
``(position, cut)`` lies in a file taken (a file holding such a key has a lower bound below
``cut``). The prefix is long enough once the files *entirely* in that range (all their vnodes
in the group, lower bound after the position, upper bound before ``cut``) hold ``limit`` live
rows: the first ``limit`` rows after the position are then all in the files taken, so sorting
only what was read gives the same chunk as sorting everything. A file without exact bounds
(long strings, timestamps, decimals, no stats) is always taken and never counted.

Composite keys: per-column min/max bound each column, so (min of each column) is a lower bound
and (max of each column) an upper bound of every key in the file in lexicographic order (a
descending column swaps min and max). What this costs is therefore bounded by how the files
are laid out: ``backfill.seekFileRows`` tables (the arrangement replica) keep each vnode's rows
in key-sorted files of that many rows with disjoint bounds, so a chunk picks about
``limit + 2 * seekFileRows`` rows per vnode, and its task reads one file when the chunk
before it ended where a file ends; an upstream whose files each span the whole key
range (no_shuffle over an unclustered table) has no file entirely after any position, and a
chunk picks every file not yet passed. A shared (no_shuffle) pick is ordered by each file's
floor, the least key it can hold after the position (core/key_floor.py), so that the cut
(storage/chunks/shared_cut.py) reads only the files up to the chunk's end (docs/ARCHITECTURE.md,
"Chunk reads").
"""

from __future__ import annotations

import functools
import heapq
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backfill_assets.core.errors import InvalidKeyValue
from backfill_assets.core.key_floor import Floor, admits_at_or_before, compare_floors, floor_after
from backfill_assets.core.keys import Key, KeyOrder, normalize_value
from backfill_assets.storage.delta.log import DataFile
from backfill_assets.storage.delta.prune import VNODE, _bound, files_in_vnodes, vnode_span
from backfill_assets.storage.rows.write import KEY_BOUNDS
from backfill_assets.storage.store.lru import LRU

SEEK_ROWS_PROPERTY = "backfill.seekFileRows"
MIN_SEEK_ROWS = 4096  # smaller files cost more in per-file overhead than they save in rows
MAX_SEEK_ROWS = 131072


def seek_file_rows(chunk_limit: int) -> int:
    """Rows per file of a table read by chunks of ``chunk_limit`` rows per vnode: one chunk
    (a vnode's rows are cut into files of this many rows, ``write.FileWriter``), so a chunk
    that ends where a file ends (``core.positions.chunk_cut``) leaves the next one exactly
    the next file to read."""
    return max(MIN_SEEK_ROWS, min(MAX_SEEK_ROWS, int(chunk_limit)))


@dataclass(frozen=True)
class ChunkFiles:
    """The files of one chunk read: per group (a vnode, or the run's vnodes in no_shuffle)."""

    groups: dict[tuple[int, ...], list[DataFile]]
    lowers: dict[str, Key | None] = field(default_factory=dict)  # path -> lower key bound
    # shared: path -> the least key it can hold after the position (core/key_floor.py)
    floors: dict[str, Floor] = field(default_factory=dict)
    # groups whose every file with rows after the position was taken (what lets a read
    # keep a vnode's whole rest: ``core.positions.keep_rows``)
    whole: frozenset[tuple[int, ...]] = frozenset()

    @property
    def distinct(self) -> list[DataFile]:
        seen: dict[str, DataFile] = {}
        for files in self.groups.values():
            for f in files:
                seen.setdefault(f.path, f)
        return list(seen.values())

    def only(self, keep) -> ChunkFiles:
        """The files ``keep(file)`` is true of (a predicate on a DataFile)."""
        groups = {g: [f for f in files if keep(f)] for g, files in self.groups.items()}
        return ChunkFiles(groups, self.lowers, self.floors, self.whole)

    @property
    def rows_scanned(self) -> int:
        """Live rows of the files read (what the barrier pays for, whatever the table's size)."""
        return sum(f.live_records or 0 for f in self.distinct)


def chunk_files(files: Sequence[DataFile], key_order: KeyOrder,
                positions: Mapping[int, Key | None], limit: int, shared: bool,
                extra: Mapping[int, int] | None = None) -> ChunkFiles:
    """The files holding the next ``limit`` rows after each position: per vnode, or (shared)
    across all of ``positions``' vnodes, which then share one position. ``extra``: rows per
    vnode the files must hold beyond ``limit`` (a replica's tombstones, storage/rows/replica.py)."""
    if shared:
        groups = [tuple(sorted(positions))] if positions else []
    else:
        groups = [(v,) for v in sorted(positions)]
    out = {}
    whole = set()
    lowers: dict[str, Key | None] = {}
    floors: dict[str, Floor] = {}
    meeting = _by_vnode(files) if not shared else None
    for group in groups:
        pos = positions[group[0]]
        more = sum((extra or {}).get(v, 0) for v in group)
        candidates = files_in_vnodes(files, group) if meeting is None else meeting(group[0])
        out[group], all_taken = _pick(candidates, set(group), pos, key_order, limit + more,
                                      lowers, floors if shared else None)
        if all_taken:
            whole.add(group)
    return ChunkFiles(out, lowers, floors, frozenset(whole))


def _by_vnode(files: Sequence[DataFile]):
    """Files meeting one vnode, from one pass over the files (a pass per vnode costs files x
    vnodes: about a second per barrier for a 20M-row replica of 5,120 files)."""
    one: dict[int, list[DataFile]] = {}
    wide: list[DataFile] = []
    for f in files:
        lo, hi = vnode_span(f)
        if lo is not None and lo == hi:
            one.setdefault(lo, []).append(f)
        else:
            wide.append(f)

    def meeting(vnode: int) -> list[DataFile]:
        return one.get(vnode, []) + files_in_vnodes(wide, [vnode])

    return meeting


class _Bounds:
    """A file's key bounds in key order (None: unbounded on that side), its per-column box
    (``low``, ``high``: per pk column, None where unbounded) and vnode span."""

    def __init__(self, f: DataFile, key_order: KeyOrder):
        self.file = f
        key = (f.path, f.size, key_order)  # a file's stats never change: computed once
        known = _BOUNDS.get(key)
        if known is None:
            box = _box(f, key_order)
            exact = _exact(f, key_order)
            lower, upper = exact or (_whole(key_order, box[0]), _whole(key_order, box[1]))
            known = (lower, upper, _span(f), box, exact is not None)
            _BOUNDS.put(key, known)
        self.lower, self.upper, self.span, self.box, self.exact = known

    def floor(self, key_order: KeyOrder, pos: Key | None) -> Floor | None:
        """The least key the file can hold after ``pos`` (None: none after it)."""
        return floor_after(key_order, *self.box, pos, self.lower if self.exact else None)


# (path, size, key order) -> (lower, upper, span, box, exact)
_BOUNDS: LRU[tuple, tuple] = LRU(1_000_000, name="file key bounds")


def _span(f: DataFile) -> tuple[int, int] | None:
    part = f.partition_values.get(VNODE)
    if part is not None:
        return int(part), int(part)
    lo, hi = _bound(f, "min", VNODE), _bound(f, "max", VNODE)
    return (int(lo), int(hi)) if isinstance(lo, int) and isinstance(hi, int) else None


def _exact(f: DataFile, key_order: KeyOrder) -> tuple[Key, Key] | None:
    """The file's exact first and last key when its writer recorded them (``KEY_BOUNDS``)."""
    exact = ((f.add_action or {}).get("tags") or {}).get(KEY_BOUNDS)
    if exact is None:
        return None
    try:
        first, last = json.loads(exact)
        return key_order.normalize(tuple(first)), key_order.normalize(tuple(last))
    except (InvalidKeyValue, ValueError, TypeError):
        return None  # not for this key order: the stats decide


def _box(f: DataFile, key_order: KeyOrder) -> tuple[tuple, tuple]:
    """Per pk column, the first and last value in key order the file's stats give (None where
    they give none usable): a box around its keys, exact for one column, loose otherwise."""
    low, high = [], []
    for c in key_order.columns:
        for side, out in (("min", low if not c.descending else high),
                          ("max", high if not c.descending else low)):
            value = _bound(f, side, c.name)
            try:
                out.append(None if value is None else normalize_value(c, value))
            except InvalidKeyValue:  # a stat of another type than the key's: no bound
                out.append(None)
    return tuple(low), tuple(high)


def _whole(key_order: KeyOrder, values: tuple) -> Key | None:
    return None if any(v is None for v in values) else tuple(values)


def _pick(files: Sequence[DataFile], group: set[int], pos: Key | None, key_order: KeyOrder,
          limit: int, lowers: dict[str, Key | None], floors: dict[str, Floor] | None = None
          ) -> tuple[list[DataFile], bool]:
    """The prefix of the group's files (by lower key bound) that holds the next ``limit``
    rows, and whether it is every file with rows after ``pos``; each taken file's lower
    bound recorded in ``lowers``. ``floors`` (a shared chunk): files are taken by the least
    key they can hold after ``pos`` instead (core/key_floor.py), recorded there."""
    cmp = key_order.compare
    if pos is not None and key_order.is_placeholder(pos):
        return [], False
    bounds = [b for b in (_Bounds(f, key_order) for f in files)
              if pos is None or b.upper is None or cmp(b.upper, pos) > 0]
    if floors is None:
        starts = [_lower_floor(b.lower) for b in bounds]
    else:
        starts = [b.floor(key_order, pos) for b in bounds]
        bounds, starts = [b for b, s in zip(bounds, starts, strict=True) if s is not None], \
            [s for s in starts if s is not None]
    order = sorted(range(len(bounds)), key=functools.cmp_to_key(
        lambda a, b: compare_floors(key_order, starts[a], starts[b])))
    taken: list[DataFile] = []
    pending: list = []  # files entirely after the position, by upper bound, not yet before cut
    ready = 0  # live rows of files entirely inside (position, cut)
    upper_key = key_order.sort_key
    for n, i in enumerate(order):
        b = bounds[i]
        taken.append(b.file)
        lowers[b.file.path] = b.lower
        if floors is not None:
            floors[b.file.path] = starts[i]
        inside = b.span is not None and all(v in group for v in range(b.span[0], b.span[1] + 1))
        if inside and b.lower is not None and b.upper is not None and (
                pos is None or cmp(b.lower, pos) > 0):
            heapq.heappush(pending, (upper_key(b.upper), i, b.file.live_records or 0))
        if n + 1 == len(order):
            break
        cut = starts[order[n + 1]]
        if not cut.prefix:
            continue
        while pending and not admits_at_or_before(key_order, cut, pending[0][0].obj):
            ready += heapq.heappop(pending)[2]
        if ready >= limit:
            return taken, False
    return taken, True


def _lower_floor(lower: Key | None) -> Floor:
    """A lower key bound as a floor (None: the file may hold any key)."""
    return Floor(()) if lower is None else Floor(tuple(lower))
