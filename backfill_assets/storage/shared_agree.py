"""no_shuffle's chunk in one read of each file: the chunk tasks agree on the cut among themselves.

A no_shuffle chunk is the first ``limit`` rows after the run's shared position, across all its
vnodes. Over an upstream whose files each span their vnode's whole key range (what a
copy-on-write MERGE leaves: every touched vnode's files rewritten into one) every barrier reads
every file. Cutting on the driver first (``shared_cut``) reads each file twice: the key columns
for the cut, then every column in the chunk tasks; over a (string, integer) key the cut was
3-5 s of a 20M-row barrier's 6-8 s (round 19).

Here the chunk tasks run as one Spark barrier stage (``mapInArrow(barrier=True)``: all start
together and may exchange messages). Each reads its files once, in the order of their floor
(core/key_floor.py), keeping its rows after the position folded into its ``limit`` smallest
(by packed ranks, as the cut folds keys), and stops when its ``limit``-th row sorts before the
next file's floor: the run's ``limit``-th row is at or before any task's. Then the tasks find
the run's ``limit``-th key together (``agree``): each sends quantiles of its candidate keys,
each counts its keys up to every quantile sent, and the range that holds the ``limit``-th key
narrows about a hundredfold a round until each task sends all its keys in it. A few rounds of
small messages through Spark's ``allGather``, instead of a second read of the table. Each task
then writes its rows up to that key, sorted by (vnode, key), as the driver-cut path's tasks do.
A null pk in any task's rows ends the agreement: that task returns its null-key rows, flagged
(``chunk_task.ranked`` marks them), and the driver takes the Spark path, which names the row.
"""

from __future__ import annotations

import base64
import functools
import json
import pickle
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.key_floor import Floor, admits_at_or_before, compare_floors
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.storage.chunk_task import BAD_KEY, RN, VNODE, cut_chunk, file_table
from backfill_assets.storage.key_search import after, search
from backfill_assets.storage.shared_cut import packed_ranks

Gather = Callable[[str], list[str]]  # every task's message, in task order (allGather)
_FOLD = 2  # chunks' worth of rows a task holds before it folds them into one
_QUANTILES = 128  # keys each task sends while the range is wide
_ALL = 4096  # a task whose range holds at most this many keys sends them all
_ROUNDS = 8  # then every task sends all its keys in the range, whatever their number


class AgreedReader:
    """The task side (picklable): read the task's files once, agree on the run's cut with
    the other tasks of the stage (``gather``: None, Spark's ``BarrierTaskContext``), keep
    the rows up to it, ranked."""

    def __init__(self, table_uri: str, options: Mapping[str, str], physical: Mapping[str, str],
                 out: pa.Schema, key_order: KeyOrder, pos: Key | None, limit: int,
                 gather: Gather | None = None):
        self.table_uri, self.options, self.physical = table_uri, dict(options), dict(physical)
        self.out = out.serialize().to_pybytes()
        self.key_order, self.pos, self.limit, self.gather = key_order, pos, limit, gather

    @property
    def out_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.out))

    def read(self, task: dict) -> tuple[pa.Table, set[int]]:
        """The task's rows of the run's chunk, ranked; no vnode is exhausted here (the
        shared strategy decides from the rows)."""
        rows, null_rows = self.candidates(task)
        gather = self.gather or _spark_gather
        if _any_null(gather, null_rows is not None):  # every task asks: none goes on alone
            flagged = null_rows if null_rows is not None else rows.slice(0, 0)
            return cut_chunk(flagged, self.key_order, {}, 1 << 62, False)[0], set()
        cut = agree(rows.select(list(self.key_order.names)), self.key_order, self.limit, gather)
        if cut is not None:
            rows = rows.slice(0, search(rows, self.key_order, cut, after=True))
        return cut_chunk(rows, self.key_order, {}, 1 << 62, False)[0], set()

    def candidates(self, task: dict) -> tuple[pa.Table, pa.Table | None]:
        """The task's ``limit`` smallest rows after the position, in key order; or, when a
        row of its vnodes has a null pk, those rows (second item)."""
        out = self.out_schema
        base = pa.schema([f for f in out if f.name not in (RN, BAD_KEY)])
        wanted = pa.array(task["vnodes"], base.field(VNODE).type)
        floors = _load(task["floors"]) if task.get("floors") else None
        files = _in_floor_order(self.key_order, task["files"], floors)
        held: list[pa.Table] = []
        count, bound = 0, None
        for f, floor in files:
            if bound is not None and floor is not None \
                    and not admits_at_or_before(self.key_order, floor, bound):
                break  # this file and every later one hold no key at or before the bound
            rows = file_table(self.table_uri, self.options, self.physical, base, f)
            if not f.get("one"):
                rows = rows.filter(pc.is_in(rows.column(VNODE), value_set=wanted))
            nulls = _null_keys(rows, self.key_order)
            if nulls is not None:
                return base.empty_table(), nulls
            mask = None if self.pos is None else after(rows, self.key_order, self.pos)
            if bound is not None:
                upto = pc.invert(after(rows, self.key_order, bound))
                mask = upto if mask is None else pc.and_(mask, upto)
            held.append(rows if mask is None else rows.filter(mask))
            count += held[-1].num_rows
            if count > _FOLD * self.limit:
                kept = _smallest(pa.concat_tables(held), self.key_order, self.limit)
                held, count = [kept], kept.num_rows
                bound = _key(kept, self.key_order, kept.num_rows - 1)
        rows = pa.concat_tables(held) if held else base.empty_table()
        return _sorted(rows, self.key_order).slice(0, self.limit), None


def agreed_tasks(tasks: Sequence[str], reader, floors: Mapping[str, Floor], pos: Key | None,
                 slots: int) -> tuple[list[str], AgreedReader]:
    """The chunk read's tasks (``chunk_read.chunk_tasks``, with its ``ChunkReader``) as a
    barrier stage's: at most ``slots`` of them (a barrier stage's tasks all run at once),
    each file with its floor; and the task side that reads one."""
    loaded = [json.loads(t) for t in tasks]
    groups = [loaded[i::slots] for i in range(min(slots, len(loaded)))] if loaded else []
    merged = []
    for group in groups:
        files = {f["path"]: f for t in group for f in t["files"]}
        if len(group) > 1:  # a file may meet several tasks' vnodes: read it once
            for f in files.values():
                f["one"] = False
        vnodes = sorted(v for t in group for v in t["vnodes"])
        merged.append(json.dumps({"vnodes": vnodes, "files": list(files.values()),
                                  "floors": _dump([floors.get(p) for p in files])}))
    return merged, AgreedReader(reader.table_uri, reader.options, reader.physical,
                                reader.out_schema, reader.key_order, pos, reader.limit)


def _spark_gather(message: str) -> list[str]:
    from pyspark import BarrierTaskContext

    return list(BarrierTaskContext.get().allGather(message))


def _any_null(gather: Gather, mine: bool) -> bool:
    """Whether any task found a null pk (every task asks, so every task knows)."""
    return any(json.loads(m) for m in gather(json.dumps(mine)))


def agree(keys: pa.Table, key_order: KeyOrder, limit: int, gather: Gather) -> Key | None:
    """The ``limit``-th smallest key of all tasks' ``keys`` (each task's in key order, no
    null), the same in every task; None when they hold fewer than ``limit`` keys."""
    n = keys.num_rows
    total = sum(_load(m) for m in gather(_dump(n)))
    if total <= limit:
        return None
    lo: Key | None = None  # the range (lo, hi] holds the need-th key of the run
    hi: Key | None = None
    need = limit
    for round_ in range(_ROUNDS + 1):
        a = 0 if lo is None else search(keys, key_order, lo, after=True)
        b = n if hi is None else search(keys, key_order, hi, after=True)
        mine = _keys(keys, key_order, range(a, b)) if b - a <= _ALL or round_ == _ROUNDS \
            else _keys(keys, key_order, _quantile_rows(a, b))
        sent = [_load(m) for m in gather(_dump((b - a <= _ALL or round_ == _ROUNDS, mine)))]
        if all(whole for whole, _ in sent):  # every key in the range: pick it
            merged = sorted((k for _, ks in sent for k in ks), key=key_order.sort_key)
            return merged[need - 1]
        pivots = sorted({k for _, ks in sent for k in ks}, key=key_order.sort_key)
        counts = [search(keys, key_order, p, after=True) - a for p in pivots]
        totals = np.sum([_load(m) for m in gather(_dump(counts))], axis=0)
        at = int(np.searchsorted(totals, need))  # the first pivot with need keys up to it
        if at > 0:
            lo, need = pivots[at - 1], need - int(totals[at - 1])
        if at < len(pivots):
            hi = pivots[at]
    raise AssertionError("the last round sends every key in the range")  # pragma: no cover


def _quantile_rows(a: int, b: int) -> list[int]:
    step = (b - a) / (_QUANTILES + 1)
    return sorted({a + int(step * (j + 1)) for j in range(_QUANTILES)} | {b - 1})


def _keys(keys: pa.Table, key_order: KeyOrder, rows) -> list[Key]:
    taken = keys.take(pa.array(list(rows), pa.int64()))
    columns = [taken.column(c).to_pylist() for c in key_order.names]
    return list(zip(*columns, strict=True))


def _dump(value) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def _load(text: str):
    return pickle.loads(base64.b64decode(text))


def _in_floor_order(key_order: KeyOrder, files: Sequence[dict], floors: Sequence | None
                    ) -> list[tuple[dict, Floor | None]]:
    """The task's files with their floors, in floor order (no floors: as given)."""
    if floors is None:
        return [(f, None) for f in files]
    pairs = list(zip(files, floors, strict=True))
    pairs.sort(key=functools.cmp_to_key(lambda x, y: compare_floors(key_order, x[1], y[1])))
    return pairs


def _null_keys(rows: pa.Table, key_order: KeyOrder) -> pa.Table | None:
    if not any(rows.column(c).null_count for c in key_order.names):
        return None
    mask = None
    for c in key_order.names:
        null = pc.is_null(rows.column(c))
        mask = null if mask is None else pc.or_(mask, null)
    return rows.filter(mask)


def _smallest(rows: pa.Table, key_order: KeyOrder, limit: int) -> pa.Table:
    """The ``limit`` smallest rows (not in order), the largest of them last."""
    packed = packed_ranks(rows.select(list(key_order.names)), key_order)
    if packed is None:
        return _sorted(rows, key_order)[:limit]
    return rows.take(pa.array(np.argpartition(packed, limit - 1)[:limit]))


def _sorted(rows: pa.Table, key_order: KeyOrder) -> pa.Table:
    """``rows`` in key order (no null pk)."""
    packed = packed_ranks(rows.select(list(key_order.names)), key_order)
    if packed is None:
        return rows.take(pc.sort_indices(rows, [
            (c.name, "descending" if c.descending else "ascending") for c in key_order.columns]))
    return rows.take(pa.array(np.argsort(packed, kind="stable")))


def _key(rows: pa.Table, key_order: KeyOrder, i: int) -> Key:
    return tuple(rows.column(c)[i].as_py() for c in key_order.names)
