"""A join MV's first barrier by tasks of this process: one read of the fact table, no row
through the JVM (docs/JOINS.md, "The bulk by tasks").

Why: the Spark bulk (join/bulk.py) read and cached the fact's columns in Spark, then wrote the
state tables through Python writer tasks and joined in Spark: every fact row crossed the JVM
and Python several times, and cost several recomputes (docs/JOINS.md, "Measured"). Here:

1. each dimension is read once into this process (``storage.read_table`` at the pair's
   version), null keys dropped, its key checked unique, each row's key hashed to its vnode;
2. tasks (threads: parquet, Arrow and numpy release the GIL) read the fact table at the pinned
   version by vnode ranges (``storage.read_tasks``: DVs, column mapping, partition values),
   look each fact's dimension row up (join/bulk_join.py), cut each join's index rows into
   contiguous vnode ranges (one future file each), and turn the joined rows into the
   aggregate's partials (the projection compiled to Arrow with Spark's meaning, as the row MV
   bulk's: ``engine.projection.exact_projection``);
3. each vnode range of each index is sorted by (vnode, join key, pk) and written as one file
   in the table's 1,024-row groups (``storage.write_sorted``); the partials are summed here
   into the groups;
4. one commit per table behind the pair, in the barrier's order (``storage.commit_written``:
   the crash matrix's bulk kills hold, a resumed bulk writes only the tables behind).

Served when the MV aggregates without kept input, its two projection stages compile to
Arrow, the fact table is a platform upstream arranged by the MV's vnodes and the tasks may
run here (``storage.local_threads``): else `TaskBulk.of` is None and the Spark bulk runs.
A value the compiled projection cannot prove Spark's (``NotExact``) also sends the whole
barrier there, before any file is written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets import storage
from backfill_assets.aggregate.store import INPUT, STATE, with_key
from backfill_assets.aggregate.store import MV as AGG_MV
from backfill_assets.arrow.expressions import ArrowProjection, NotExact
from backfill_assets.core.aggregate_definition import GROUP_KEY
from backfill_assets.core.errors import DimensionKeyNotUnique
from backfill_assets.core.names import VNODE
from backfill_assets.engine.projection import exact_projection
from backfill_assets.join import held
from backfill_assets.join.bulk_join import (
    Lookup,
    index_rows,
    joined_rows,
    merged_partials,
    partials,
)
from backfill_assets.join.output import AggregateOutput, Output
from backfill_assets.join.sources import Side
from backfill_assets.join.store import JoinStore, Pair, index_phase, keyed_write
from backfill_assets.mv import owned_tables
from backfill_assets.step.request import Hook
from backfill_assets.upstream import same_vnodes


@dataclass(frozen=True)
class _Task:
    """What one read task returns: its fact rows' count, its partials, its index rows per
    (join, vnode range)."""

    rows: int
    partials: pa.Table
    index: dict[tuple[int, int], pa.Table]


@dataclass
class TaskBulk:
    """The first barrier of one join MV at ``to`` by tasks here (see the module docstring)."""

    store: JoinStore
    out: AggregateOutput
    sides: list[Side]
    to: Pair
    hook: Hook
    fact: storage.TableVersion
    stages: tuple[ArrowProjection, ArrowProjection]
    threads: int

    @classmethod
    def of(cls, spark, upstream_uri: str, sides: list[Side], store: JoinStore, out: Output,
           to: Pair, hook: Hook) -> TaskBulk | None:
        """The task bulk of this barrier, or None where it cannot serve (module docstring)."""
        if not isinstance(out, AggregateOutput) or out.proj.tables.kept:
            return None
        so, jt = store.tables.storage_options, store.jt
        if not same_vnodes(upstream_uri, to.fact, list(jt.plan.pk), jt.vnode_count, so):
            return None
        fact = storage.TableVersion.load(upstream_uri, to.fact, so)
        threads = storage.local_threads(spark, fact.live_rows)
        p = out.proj
        stages = (exact_projection(spark, p.rows, p.upstream_schema),
                  exact_projection(spark, p.values, p.rows_schema))
        if threads is None or stages[0] is None or stages[1] is None:
            return None
        return cls(store, out, sides, to, hook, fact, stages, threads)  # type: ignore[arg-type]

    def run(self, behind: list[str], report_extra: dict) -> int | None:
        """Write every table in ``behind`` in commit order; the fact rows read, or None when
        a value is not proven exact in Arrow (nothing committed: the Spark bulk serves)."""
        seconds = report_extra.setdefault("bulk_seconds", {})
        started = time.perf_counter()
        lookups = [self._dimension(i, s) for i, s in enumerate(self.sides)]
        seconds["read_dimensions"] = _since(started)
        started = time.perf_counter()
        reads = storage.read_tasks(self.fact, self.store.jt.fact_row_schema.names,
                                   self.threads)
        ranges = _ranges(self.fact.live_rows, self.store.vnode_count)
        indexed = [i for i in range(self.store.joins) if index_phase(i) in behind]
        done = self._map(lambda task: _refused(lambda: self._task(
            reads, task, lookups, indexed, ranges)), reads.tasks)
        if any(d is None for d in done):
            return None  # nothing was written yet
        seconds["read_join"] = _since(started)
        started = time.perf_counter()
        written = {}
        for i in indexed:
            written[index_phase(i)] = self._index_files(i, [d.index for d in done], ranges)
        seconds["index_write"] = _since(started)
        started = time.perf_counter()
        self._commit(behind, written, lookups)
        seconds["commits"] = _since(started)
        started = time.perf_counter()
        state = merged_partials(self.out.proj, [d.partials for d in done])
        report_extra["groups"] = write_groups(self.store, self.out, state,
                                              self.out.proj.tables.input_schema.empty_table(),
                                              self.to, self.hook, behind)
        seconds["mv"] = _since(started)
        return sum(d.rows for d in done)

    def _map(self, fn: Callable, items: Sequence) -> list:
        with ThreadPoolExecutor(max(1, min(self.threads, len(items)))) as pool:
            return list(pool.map(fn, items))

    def _dimension(self, i: int, side: Side) -> Lookup:
        """Join ``i``'s dimension at the pair: rows with a null key dropped, the key checked
        unique, each row with its key's vnode (hashed as the barrier hashes it)."""
        jt, key, so = self.store.jt, list(side.join.key), self.store.tables.storage_options
        schema = pa.schema([f for f in jt.dimension_schemas[i] if f.name != VNODE])
        # a platform table keyed by the declared key, in the MV's vnode count, holds each
        # row's vnode already (the same hash of the same key): no hashing here
        own = same_vnodes(side.uri, side.version, key, jt.vnode_count, so)
        columns = [*schema.names, VNODE] if own else schema.names
        rows = storage.read_table(side.uri, side.version, columns, storage_options=so)
        rows = rows.filter(valid_keys(rows, key))
        refuse_duplicates(rows, key)
        plan = jt.plan.sides[i]
        if not own:
            return Lookup(plan.on, plan.key, jt.with_vnode(rows.select(schema.names)
                                                           .cast(schema), key))
        vnodes = pc.cast(rows.column(VNODE), pa.int32())
        return Lookup(plan.on, plan.key, rows.select(schema.names).cast(schema)
                      .append_column(VNODE, vnodes))

    def _task(self, reads: storage.ReadTasks, task: str, lookups: list[Lookup],
              indexed: list[int], ranges: int) -> _Task:
        """One slice of the fact table: its index rows by vnode range, and the partials of
        its joined rows (the fact rows keep their pk's vnode, the MV's)."""
        jt = self.store.jt
        schema = jt.fact_row_schema.append(pa.field(VNODE, pa.int32()))
        facts = reads.read(task).select(schema.names).cast(schema)
        positions = [lk.positions(facts) for lk in lookups]
        p, (rows_stage, values_stage) = self.out.proj, self.stages
        joined = joined_rows(jt, facts, lookups, positions)
        joined = joined.select(p.upstream_schema.names).cast(p.upstream_schema)
        values = values_stage.project(rows_stage.project(joined))  # may refuse NotExact
        index = {}
        for i in indexed:
            names = self.store.table(index_phase(i)).schema.names
            rows = index_rows(jt, i, facts, lookups[i], positions[i], names)
            index.update({(i, r): part for r, part in _cut(rows, ranges, jt.vnode_count)})
        return _Task(facts.num_rows, partials(p, values), index)

    def _index_files(self, i: int, parts: list[dict], ranges: int) -> list:
        """Join ``i``'s index: each vnode range's rows from every task, sorted by (vnode,
        join key, pk), one file each."""
        t = self.store.table(index_phase(i))
        snap = self.store.snapshot(index_phase(i))
        key = self.store.write_key(index_phase(i))
        total = sum(rows.num_rows for p in parts for (j, _), rows in p.items() if j == i)

        def write(r: int) -> list:
            rows = [p[(i, r)] for p in parts if (i, r) in p]
            both = pa.concat_tables(rows) if rows else None
            return [] if both is None else _write(snap, t, both, both.num_rows, key, total)

        return [f for files in self._map(write, range(ranges)) for f in files]

    def _commit(self, behind: list[str], written: dict[str, list], lookups: list[Lookup]
                ) -> None:
        """One commit per state table behind the pair, in the barrier's order."""
        for phase in self.store.phases:
            if phase not in behind:
                continue
            snap, t = self.store.snapshot(phase), self.store.table(phase)
            rows = None
            if phase not in written:  # a dimension table: its rows are the lookup's
                rows = lookups[int(phase.rsplit("_", 1)[1])].rows
                written[phase] = _write(snap, t, rows, storage.file_rows_for(rows.num_rows),
                                        self.store.write_key(phase), rows.num_rows)
            intent = owned_tables.intent(self.store.name, phase, range(self.store.vnode_count),
                                         self.to.fact, extra=self.to.txns(self.store.name, phase))
            done = storage.commit_written(
                snap, intent, storage.written_files(snap, written[phase]),
                hook=lambda point, phase=phase: self.hook(f"{phase}_{point}"))
            if rows is not None and done.version is not None:  # the next barrier's lookup
                held.hold(self.store.snapshot(phase, done.version),
                          rows.select(t.schema.names).cast(t.schema))
            self.hook(f"after_{phase}_commit")


def write_groups(store: JoinStore, out: AggregateOutput, state: pa.Table, kept: pa.Table,
                 to: Pair, hook: Hook, behind: list[str]) -> int:
    """The aggregate's tables behind the pair from its groups' state rows and kept input
    (the aggregate bulk's writes, each commit carrying the pair); the number of groups."""
    t, agg = out.proj.tables, out.agg
    keyed = with_key(state, t)
    afters = {STATE: lambda: keyed, INPUT: lambda: with_key(t.input_of(kept), t),
              AGG_MV: lambda: with_key(t.mv_rows(keyed, kept), t, keyed.column(GROUP_KEY))}
    for phase in agg.phases:
        if phase in behind:
            snap, old = agg.read(phase, None)
            keyed_write(store.name, store.vnode_count, agg.table(phase), snap, old,
                        afters[phase](), to, hook)
            hook(f"after_{phase}_commit")
    return state.num_rows


def refuse_duplicates(rows: pa.Table, key: list[str]) -> None:
    """A declared key holding two rows would multiply the facts that reference it: refused
    before anything of the MV is written (as the barrier's algebra refuses it)."""
    counts = rows.group_by(key, use_threads=False).aggregate([([], "count_all")])
    if counts.num_rows != rows.num_rows:
        raise DimensionKeyNotUnique(
            f"the dimension holds two rows for one value of its declared key {key}: declare "
            "the dimension's real key (unique, like a primary key)")


def _write(snap: storage.TableVersion, t, rows: pa.Table, file_rows: int,
           write_key: Sequence[str], table_rows: int) -> list:
    """``rows`` sorted by (vnode, the table's key) as new files of table ``t`` (its columns,
    nullable as the table was created: join/store.py), their ``write_key`` values (what the
    barriers' keyed commits find rows by: `JoinStore.write_key`) handed to the key cache
    for a table of ``table_rows`` rows, so the first barrier after the bulk reads no file's
    keys back."""
    schema = pa.schema([f.with_nullable(True) for f in t.schema])
    return storage.write_sorted(snap, schema, rows.take(sort_order(rows, [VNODE, *t.key])),
                                max(1, file_rows), write_key, table_rows)


def sort_order(rows: pa.Table, names: Sequence[str]) -> pa.Array:
    """The row order by ``names`` ascending (unique together, so any sort gives the same):
    numpy's lexsort where every column is a non-null integer or date (several times faster
    than Arrow's multi-column sort on the index's integer keys), else Arrow's."""
    columns = [rows.column(n) for n in names]
    if all((pa.types.is_integer(c.type) or pa.types.is_date(c.type)) and c.null_count == 0
           for c in columns):
        return pa.array(np.lexsort([c.to_numpy() for c in reversed(columns)]))
    return pc.sort_indices(rows, [(n, "ascending") for n in names])


def _refused(run: Callable[[], _Task]) -> _Task | None:
    """A task's result, or None when the compiled projection refused a value."""
    try:
        return run()
    except NotExact:
        return None


def valid_keys(rows: pa.Table, key: Sequence[str]) -> pa.Array:
    keep = pc.is_valid(rows.column(key[0]))
    for k in key[1:]:
        keep = pc.and_(keep, pc.is_valid(rows.column(k)))
    return keep


def _ranges(rows: int, vnode_count: int) -> int:
    """Contiguous vnode ranges an index is written in, one file each: about the files a
    table of ``rows`` rows is written in (``storage.file_rows_for``)."""
    return max(1, min(vnode_count, math.ceil(rows / storage.file_rows_for(max(rows, 1)))))


def _cut(rows: pa.Table, ranges: int, vnode_count: int):
    """``rows`` as (vnode range, its rows) pairs (ranges of ``vnode_count / ranges``)."""
    r = (rows.column(VNODE).to_numpy().astype(np.int64) * ranges) // vnode_count
    order = np.argsort(r, kind="stable")
    r = r[order]
    rows = rows.take(pa.array(order))
    bounds = np.searchsorted(r, np.arange(ranges + 1))
    for i in range(ranges):
        if bounds[i + 1] > bounds[i]:
            yield i, rows.slice(bounds[i], bounds[i + 1] - bounds[i])


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
