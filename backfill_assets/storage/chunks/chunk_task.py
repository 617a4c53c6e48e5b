"""The task side of a chunk read (picklable, pure Arrow): read a task's files, resolve a
replica's change rows, keep each vnode's chunk after its position, ranked.

A per-vnode task reads its vnode's files one at a time, in the order of their lower key bound,
and stops as soon as the rows read hold enough rows after the position that sort before the
next file's lower bound: every row of the vnode before that bound is then in the files read
(their lower bounds are the smallest), so a chunk ending there, or at ``limit`` rows before
it, is exact. The driver's seek (``seek.chunk_files``) can only count files it knows to lie
wholly inside the range, so it takes one or two more; the task skips them.

Why a chunk may end at a file's end (``core.positions.chunk_cut``): the replica cuts each
vnode's rows into files of a chunk's rows (``seek.seek_file_rows``), so a chunk that ends
where a file ends lets the next one read exactly the next file. Chunks of exactly ``limit``
rows drift off the files at the first deleted or inserted row and then decode two files per
chunk (about 2.5 chunks of rows for one: decoding is the largest cost of a chunk task).
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core import names
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.positions import chunk_cut, chunk_window, rows_to_see
from backfill_assets.storage.chunks.key_search import (
    after,
    count_before,
    in_key_order,
    rows_after,
    searchable,
)
from backfill_assets.storage.delta import dv
from backfill_assets.storage.rows import replica
from backfill_assets.storage.rows.scan import file_rows, unb64_table

RN, BAD_KEY, VNODE = names.ROW_NUMBER, names.BAD_KEY, "vnode"
# the mask of one file's rows a read keeps (None: all of them)
Keep = Callable[[pa.Table], "pa.ChunkedArray | pa.Array | None"]


class ChunkReader:
    """The task side (picklable): read the task's files, keep its chunk, sorted."""

    def __init__(self, table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                 out: pa.Schema, key_order: KeyOrder, positions: Mapping[int, Key], limit: int,
                 shared: bool, per_vnode: bool = False, overlay: bool = False, tail: int = 0,
                 ranged: bool = False, upper: Key | None = None):
        self.table_uri, self.options, self.physical = table_uri, dict(options), dict(physical)
        self.out = out.serialize().to_pybytes()
        self.key_order, self.positions, self.limit = key_order, dict(positions), limit
        self.shared, self.per_vnode, self.overlay = shared, per_vnode, overlay
        self.tail = tail
        # a shared chunk whose cut is known (storage/chunks/shared_cut.py): every vnode keeps its
        # rows in (position, upper], upper None: all after the position; no limit to cut
        self.ranged, self.upper = ranged, upper

    @property
    def out_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.out))

    def __call__(self, batches):
        out = self.out_schema
        for batch in batches:
            for text in batch.column(0).to_pylist():
                chunk = self.chunk(json.loads(text))
                if self.per_vnode:
                    chunk = last_of_each_vnode(chunk)
                yield from chunk.cast(out).to_batches(max_chunksize=65536)

    def chunk(self, task: dict) -> pa.Table:
        """One task's chunk (``read``), ranked."""
        return self.read(task)[0]

    def read(self, task: dict) -> tuple[pa.Table, set[int]]:
        """One task's chunk: its rows after each position, as many per vnode as
        ``core.positions.chunk_cut`` keeps (read in order: up to the end of a file when that
        is within the chunk window), or its rows up to the cut (``ranged``), ranked; and the
        vnodes it exhausted (none when ``ranged``: the shared strategy decides)."""
        if self.ranged:  # each file's rows in (position, cut] kept as it is read, then sorted
            return cut_chunk(self._read(task, self._in_range), self.key_order, {}, 1 << 62,
                             False)[0], set()
        whole = set(task.get("whole", ()))
        if "order" in task:
            table, stopped, boundaries = self._read_in_order(task, whole)
            whole -= stopped
        else:
            table, boundaries = self._read(task), {}
        chunk, exhausted = cut_chunk(table, self.key_order, self.positions, self.limit,
                                     self.shared, self.tail, whole, boundaries)
        present = set(pc.unique(chunk.column(VNODE)).to_pylist()) if chunk.num_rows else set()
        return chunk, exhausted | (whole - present)  # read all a vnode has: none left

    def _read_in_order(self, task: dict, whole: set[int]
                       ) -> tuple[pa.Table, set[int], dict[int, list[Key]]]:
        """Per vnode, its files one at a time until they hold its chunk (module docstring);
        then a replica's change rows resolved with everything read, once. Also the vnodes
        whose reading stopped before their last file (their rest was not all read), and per
        vnode the lower bound of the next file after each file read: every row of the vnode
        before it was read, so a chunk may end there (``chunk_cut``'s boundaries)."""
        out = self.out_schema
        base = pa.schema([f for f in out if f.name not in (RN, BAD_KEY)])
        read = base.append(pa.field(replica.VERSION, pa.int64())).append(
            pa.field(replica.DELETED, pa.bool_())) if self.overlay else base
        order = pickle.loads(base64.b64decode(task["order"]))
        entries = {f["path"]: f for f in task["files"]}
        changes = unb64_table(task.get("changes")) if self.overlay else None
        dead = replica.tombstones(changes) if changes is not None else {}
        low = chunk_window(self.limit, self.tail)[0]
        cache: dict[str, pa.Table] = {}
        got: list[pa.Table] = []
        stopped: set[int] = set()
        boundaries: dict[int, list[Key]] = {}
        for vnode in task["vnodes"]:
            mine: list[tuple[pa.Table, bool]] = []  # rows read, and whether in key order
            seq = order.get(vnode, [])
            pos = self.positions.get(vnode)
            enough = rows_to_see(self.limit, self.tail) if vnode in whole else max(1, low)
            for i, (path, _) in enumerate(seq):
                if path not in cache:
                    cache[path] = file_table(self.table_uri, self.options, self.physical,
                                             read, entries[path])
                rows = cache[path]
                if not entries[path].get("one"):  # a file of several vnodes: keep this one's
                    rows = rows.filter(pc.equal(rows.column(VNODE), vnode))
                ordered = in_key_order(rows, self.key_order)  # one check, several searches
                if pos is not None:  # rows at or before the position are never kept
                    rows = rows_after(rows, self.key_order, pos, ordered)
                mine.append((rows, ordered))
                cut = seq[i + 1][1] if i + 1 < len(seq) else None
                if cut is None:
                    continue
                boundaries.setdefault(vnode, []).append(cut)
                # a tombstone may delete any row counted: count them all as deleted
                if sum(count_before(t, self.key_order, cut, o) for t, o in mine) \
                        - dead.get(vnode, 0) >= enough:
                    stopped.add(vnode)
                    break
            got += [t for t, _ in mine]
        rows = pa.concat_tables(got) if got else read.empty_table()
        if changes is not None and changes.num_rows:
            rows = replica.overlay(rows, changes.cast(read), self.key_order)
        return rows.select(base.names), stopped, boundaries

    def _in_range(self, rows: pa.Table) -> pa.ChunkedArray | None:
        """A shared chunk's mask over one file's rows: after the run's position, at or before
        the cut (over files spanning the whole key range, most of what a task reads is
        outside, so the file is filtered once, by this mask: see ``read_task_rows``)."""
        pos = next(iter(self.positions.values()), None)
        mask = None if pos is None else after(rows, self.key_order, pos)
        if self.upper is not None:
            upto = pc.invert(after(rows, self.key_order, self.upper))
            mask = upto if mask is None else pc.and_(mask, upto)
        return mask

    def _read(self, task: dict, keep: Keep | None = None) -> pa.Table:
        """The task's rows (a replica's resolved with its change rows: storage/rows/replica.py);
        ``keep``: the mask of each file's rows to keep, applied as it is read (no replica)."""
        out = self.out_schema
        base = pa.schema([f for f in out if f.name not in (RN, BAD_KEY)])
        if not self.overlay:
            return read_task_rows(self.table_uri, self.options, self.physical, base, task, keep)
        lsm = base.append(pa.field(replica.VERSION, pa.int64())).append(
            pa.field(replica.DELETED, pa.bool_()))
        rows = read_task_rows(self.table_uri, self.options, self.physical, lsm, task)
        changes = unb64_table(task.get("changes"))
        if changes is not None and changes.num_rows:
            rows = replica.overlay(rows, changes.cast(lsm), self.key_order)
        return rows.select(base.names)


def read_task_rows(table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                   base: pa.Schema, task: dict, keep: Keep | None = None) -> pa.Table:
    """The rows of a task's vnodes (``base`` columns) in its files: DVs applied, row counts
    checked, partition values from the log; rows of other vnodes in those files dropped, and
    those outside ``keep``'s mask when given.

    Each file is filtered at most once, by one mask, and not at all when it holds only the
    task's vnode and no ``keep``: a filter copies every column, and three of them (vnodes,
    position, cut) cost as much as decoding the file."""
    wanted = pa.array(task["vnodes"], base.field(VNODE).type)
    tables = []
    for f in task["files"]:
        rows = file_table(table_uri, options, physical, base, f)
        # "one": the file holds a single vnode, and it meets the task's: all of it is wanted
        mask = None if f.get("one") else pc.is_in(rows.column(VNODE), value_set=wanted)
        more = keep(rows) if keep is not None else None
        if more is not None:
            mask = more if mask is None else pc.and_(mask, more)
        tables.append(rows if mask is None else rows.filter(mask))
    return pa.concat_tables(tables) if tables else base.empty_table()


def file_table(table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
               base: pa.Schema, f: dict) -> pa.Table:
    """One task file entry's live rows (``base`` columns)."""
    deleted = dv.load(table_uri, f["dv"], options) if f["dv"] else None
    return file_rows(f["uri"], options, physical, base, rows=f["rows"], deleted=deleted,
                     partition=unb64_table(f["parts"]))


def take_chunk(table: pa.Table, key_order: KeyOrder, positions: Mapping[int, Key],
               limit: int, shared: bool, tail: int = 0,
               whole: Collection[int] = ()) -> pa.Table:
    """``cut_chunk``'s rows, knowing no file boundary."""
    return cut_chunk(table, key_order, positions, limit, shared, tail, whole)[0]


def cut_chunk(table: pa.Table, key_order: KeyOrder, positions: Mapping[int, Key],
              limit: int, shared: bool, tail: int = 0, whole: Collection[int] = (),
              boundaries: Mapping[int, Sequence[Key]] | None = None
              ) -> tuple[pa.Table, set[int]]:
    """The rows after each vnode's position (no position: all), the first ``limit`` per vnode
    (``shared``: of the whole table) in key order; sorted by (vnode, key), with RN and
    BAD_KEY; and the vnodes whose rest that is. A vnode in ``whole`` (``table`` holds all it
    has left) keeps up to ``limit + tail`` rows when that is all of them; one with
    ``boundaries`` (keys before which ``table`` holds every row of it) may end its chunk at
    one (``chunk_cut``)."""
    keys = [(c.name, "descending" if c.descending else "ascending", "at_end")
            for c in key_order.columns]
    if shared:
        pos = next(iter(positions.values()), None)
        if pos is not None:
            table = table.filter(after(table, key_order, pos))
        table = table.take(pc.sort_indices(table, keys)[:limit])
    table = table.take(pc.sort_indices(table, [(VNODE, "ascending", "at_end"), *keys]))
    vnodes = table.column(VNODE).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, vnodes[1:] != vnodes[:-1]]) if len(vnodes) else []
    # sorted just above: each vnode's piece is in key order unless a pk is null (or of a type
    # whose Python order might differ from Arrow's): then it can be searched, not masked
    ordered = not shared and bool(len(vnodes)) and searchable(table, key_order)
    pieces = []
    exhausted: set[int] = set()
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(vnodes)
        piece = table.slice(start, stop - start)
        vnode = int(vnodes[start])
        pos = None if shared else positions.get(vnode)
        if pos is not None:
            piece = rows_after(piece, key_order, pos, ordered)
        if not shared:
            ends = [count_before(piece, key_order, cut, ordered)
                    for cut in (boundaries or {}).get(vnode, ())]
            keep, done = chunk_cut(piece.num_rows, limit, tail, vnode in whole, ends)
            piece = piece.slice(0, keep)
            if done:
                exhausted.add(vnode)
        pieces.append(piece)
    table = pa.concat_tables(pieces) if pieces else table
    return ranked(table, key_order), exhausted


def last_of_each_vnode(chunk: pa.Table) -> pa.Table:
    """One row per vnode of a ranked chunk: its last row (RN = the vnode's rows), BAD_KEY set
    when any of its rows was flagged."""
    n = chunk.num_rows
    if not n:
        return chunk
    vnodes = chunk.column(VNODE).to_numpy(zero_copy_only=False)
    last = np.flatnonzero(np.r_[vnodes[1:] != vnodes[:-1], True])
    bad = chunk.column(BAD_KEY).to_numpy(zero_copy_only=False).astype(np.int64)
    bad_before = np.r_[0, np.cumsum(bad)]  # flagged rows before each index
    first = np.r_[0, last[:-1] + 1]
    any_bad = (bad_before[last + 1] - bad_before[first]) > 0
    out = chunk.take(pa.array(last))
    return out.set_column(out.schema.get_field_index(BAD_KEY), BAD_KEY, pa.array(any_bad))


def first_of_each_vnode(table: pa.Table, limit: int, tail: int = 0, boundary: int = 0
                        ) -> tuple[pa.Table, set[int]]:
    """The first chunk of each vnode of rows already in (vnode, key) order, which are all the
    vnode's rows, and the vnodes it exhausts (``chunk_cut``): a vnode of at most ``limit +
    tail`` keeps them all; ``boundary``: rows of the vnode's first replica file (a chunk
    ending there starts the next one at a file's first row)."""
    vnodes = table.column(VNODE).to_numpy(zero_copy_only=False)
    if not len(vnodes):
        return table, set()
    starts = np.flatnonzero(np.r_[True, vnodes[1:] != vnodes[:-1]])
    ends = np.r_[starts[1:], len(vnodes)]
    cuts = [chunk_cut(int(n), limit, tail, True, [boundary] if boundary else [])
            for n in ends - starts]
    stops = starts + np.array([keep for keep, _ in cuts], dtype=np.int64)
    exhausted = {int(vnodes[a]) for a, (_, done) in zip(starts, cuts, strict=True) if done}
    return table.take(pa.array(np.concatenate([np.arange(a, b) for a, b in
                                               zip(starts, stops, strict=True)]))), exhausted


def ranked(table: pa.Table, key_order: KeyOrder) -> pa.Table:
    """Add RN (rank inside the vnode) and BAD_KEY to rows sorted by (vnode, key)."""
    n = table.num_rows
    vnodes = table.column(VNODE).to_numpy(zero_copy_only=False)
    new_run = np.r_[True, vnodes[1:] != vnodes[:-1]] if n else np.zeros(0, bool)
    index = np.arange(n)
    run_start = np.maximum.accumulate(np.where(new_run, index, 0)) if n else index
    rank = index - run_start + 1
    bad = np.zeros(n, bool)
    same = ~new_run.copy()
    for name in key_order.names:
        column = table.column(name)
        bad |= column.is_null().to_numpy(zero_copy_only=False)
        if n > 1:
            eq = pc.fill_null(pc.equal(column.slice(1), column.slice(0, n - 1)), False)
            same[1:] &= eq.to_numpy(zero_copy_only=False)
    bad |= same
    return table.append_column(RN, pa.array(rank, pa.int64())).append_column(
        BAD_KEY, pa.array(bad))
