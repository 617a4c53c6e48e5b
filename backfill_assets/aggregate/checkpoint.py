"""The group state between checkpoints: a snapshot-mode barrier brings the held group state
forward in memory and commits the state table only every few barriers (RisingWave's
checkpoint frequency), so most barriers make one keyed commit (the MV) and the progress.

Why it stays exactly once: the state table's app transaction names the barrier its rows are
at (the checkpoint, c); the MV and the progress are at the barrier v >= c. A process that
does not hold the state at v (a new process, a crash, another writer, an evicted entry)
reads the table at c and replays the change feed (c, v] into the state only
(`replay`): the MV already holds those barriers, and the state is a function of
its own rows and the change range, as in every recovery. A barrier after a replay commits
its state (a process that starts cold, such as a sensor's run per barrier, would otherwise
replay a growing range). An entry is valid only for the state table's id and version it
started from and the barrier version it is at, so a commit of any other process, or a
barrier this process did not complete, misses.

When a checkpoint is due: every CHECKPOINT_BARRIERS barriers, or once CHECKPOINT_ROWS signed
rows have entered since the last one (the replay a crash costs is then bounded), after a
replay, and whenever the state is not held whole (too large for aggregate/held.py: then every
barrier commits it, as before). Its commit writes every group changed since the last
checkpoint (their rows at the checkpoint before, at the barrier after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets import storage
from backfill_assets.aggregate import held
from backfill_assets.aggregate.store import (
    STATE,
    AggregateStore,
    distinct_groups,
    group_texts,
    keyed_state,
    table_id,
)
from backfill_assets.core.aggregate_definition import GROUP_KEY

Commit = tuple[str, storage.TableVersion, pa.Table, pa.Table]  # phase, version read, rows

CHECKPOINT_BARRIERS = 8  # barriers between two commits of the group state, at most
CHECKPOINT_ROWS = 1_000_000  # signed rows entered since the checkpoint, at most


@dataclass(frozen=True)
class Ahead:
    """Every group's state row at barrier ``barrier``, brought from the state table's
    version ``table_version`` (id ``table_id``); ``dirty``: the keys of the groups each
    barrier since then changed (made distinct only at the checkpoint: a distinct over every
    key since the checkpoint at each barrier grew with every barrier since it);
    ``barriers`` / ``change_rows``: what entered since then."""

    table_id: str
    table_version: int
    barrier: int
    rows: pa.Table
    dirty: tuple[pa.Array, ...]
    barriers: int
    change_rows: int

    @property
    def due(self) -> bool:
        """Whether the next barrier commits the state."""
        return self.barriers >= CHECKPOINT_BARRIERS or self.change_rows >= CHECKPOINT_ROWS

    def due_after(self, change_rows: int) -> bool:
        """Whether the barrier that adds ``change_rows`` signed rows commits the state."""
        return self.barriers + 1 >= CHECKPOINT_BARRIERS \
            or self.change_rows + change_rows >= CHECKPOINT_ROWS

    def changed(self) -> pa.Array:
        """The keys of the groups changed since the checkpoint, once each."""
        return pc.unique(pa.chunked_array(self.dirty, pa.string()).combine_chunks())

    def touched(self, keys: pa.Array) -> pa.ChunkedArray:
        """Which rows are of the groups ``keys`` (a group that does not exist has none)."""
        return pc.is_in(self.rows.column(GROUP_KEY), value_set=keys)

    def of(self, keys: pa.Array) -> pa.Table:
        """The rows of the groups ``keys``."""
        return self.rows.filter(self.touched(keys))

    def advanced(self, keys: pa.Array, touched: pa.ChunkedArray, new_rows: pa.Table,
                 barrier: int, change_rows: int) -> Ahead:
        """The state after a barrier that replaced the groups ``keys`` (their rows:
        ``touched``) by ``new_rows`` (their live rows; a group without one is gone)."""
        kept = self.rows.filter(pc.invert(touched))
        rows = pa.concat_tables([kept, new_rows.select(kept.schema.names).cast(kept.schema)])
        if rows.column(0).num_chunks > 16:
            rows = rows.combine_chunks()
        return replace(self, barrier=barrier, rows=rows, dirty=(*self.dirty, keys),
                       barriers=self.barriers + 1, change_rows=self.change_rows + change_rows)


# Why a thread: a barrier that does not checkpoint needs every group's rows only for the next
# barrier, so they are brought forward (a filter and a concat of every group's row) while
# the barrier finishes the MV's rows and commits them; its completion waits for them
_ADVANCING = ThreadPoolExecutor(1, thread_name_prefix="aggregate-state")
_AHEAD: storage.LRU[str, Ahead] = storage.LRU(16, name="aggregate state ahead",
                                              weight=lambda a: a.rows.nbytes,
                                              max_weight=512 << 20)


def _uri(uri: str) -> str:
    return uri.rstrip("/")


def current(uri: str, snap: storage.TableVersion, barrier: int) -> Ahead | None:
    """The state this process holds at ``barrier``, brought from ``snap`` (the state table's
    latest version), or None."""
    known = table_id(snap)
    return _AHEAD.get(_uri(uri), valid=lambda a: a.table_id == known
                      and a.table_version == snap.version and a.barrier == barrier)


def start(uri: str, table: str, table_version: int, barrier: int, rows: pa.Table,
          dirty: tuple[pa.Array, ...], change_rows: int, due: bool) -> None:
    """Hold ``rows`` (every group's state at ``barrier``, brought from the state table's
    ``table_version``, id ``table``); ``due``: the next barrier commits them (then they are
    held whatever their size, for that barrier; otherwise only when they fit)."""
    if not due and not held.fits(rows.num_rows):
        forget(uri)
        return
    _AHEAD.put(_uri(uri), Ahead(table, table_version, barrier, rows, dirty,
                                CHECKPOINT_BARRIERS if due else 0, change_rows))


def committed_whole(uri: str, snap: storage.TableVersion, applied: storage.Applied | None,
                    barrier: int) -> None:
    """The state table committed whole at ``barrier`` from ``snap`` (a bulk or a recompute
    barrier): that commit is a checkpoint. When the process holds the table's rows at the
    committed version (aggregate/held.py), the next barrier starts from them and need not
    commit the state again, as after any checkpoint; otherwise (and when nothing was
    committed, so the table's app transaction may name an older barrier) nothing is held."""
    rows = None if applied is None or applied.version is None \
        else held.rows_at(uri, table_id(snap), applied.version)
    if rows is None:
        forget(uri)
    else:
        start(uri, table_id(snap), applied.version, barrier, rows, (), 0, due=False)


def keep(uri: str, ahead: Ahead) -> None:
    """Hold ``ahead`` (its barrier completed), or drop it when it no longer fits."""
    if held.fits(ahead.rows.num_rows):
        _AHEAD.put(_uri(uri), ahead)
    else:
        forget(uri)


def forget(uri: str) -> None:
    _AHEAD.discard_where(lambda k: k == _uri(uri))


def _moved(uri: str, table: str, base: int, version: int) -> None:
    """The state table compacted from ``base`` to ``version`` (no row changed): a state
    brought from ``base`` is brought from ``version`` as well."""
    ahead = _AHEAD.get(uri, valid=lambda a: a.table_id == table and a.table_version == base)
    if ahead is not None:
        _AHEAD.put(uri, replace(ahead, table_version=version))


held.on_moved(_moved)


def state_step(store: AggregateStore, at: int, to: int, keys: pa.Array,
               vnodes: Sequence[int] | None, changes: pa.Table
               ) -> tuple[pa.Table, Commit | None, Callable[[storage.Applied | None], None]]:
    """The state of the groups ``keys`` after signed ``changes`` (barrier ``at`` -> ``to``):
    (their live rows with `GROUP_KEY`, the state table's commit when a checkpoint is due,
    what to call with that commit's result once every commit of the barrier landed)."""
    t, uri = store.agg, store.table(STATE).uri
    snap = store.snapshot(STATE)
    ahead, touched = current(uri, snap, at), None
    if ahead is None:  # the table holds ``at`` (a barrier after a skipped commit replays)
        snap, old = store.read(STATE, keys, vnodes)
        whole = held.rows_at(uri, table_id(snap), snap.version)
        if whole is not None:  # held whole: this barrier checkpoints, later ones may skip
            ahead = Ahead(table_id(snap), snap.version, at, whole, (), CHECKPOINT_BARRIERS, 0)
    else:
        old = ahead.rows.filter(touched := ahead.touched(keys))
    new = keyed_state(t, old, changes)
    if ahead is None:  # not held whole: committed at every barrier
        return new, (STATE, snap, old, new), lambda _: forget(uri)
    if touched is None:
        touched = ahead.touched(keys)
    if not ahead.due_after(changes.num_rows):  # brought forward beside the barrier's commits
        later = _ADVANCING.submit(ahead.advanced, keys, touched, new, to, changes.num_rows)
        return new, None, lambda _: keep(uri, later.result())
    after = ahead.advanced(keys, touched, new, to, changes.num_rows)
    dirty = after.changed()
    before = store.read(STATE, dirty)[1]  # the rows the table holds: the checkpoint's

    def checkpointed(applied: storage.Applied | None) -> None:
        if applied is None or applied.version != snap.version + 1:
            forget(uri)  # not committed by this barrier, or rebased past another writer
        else:
            start(uri, after.table_id, applied.version, to, after.rows, (), 0, due=False)

    return new, (STATE, snap, before, after.of(dirty)), checkpointed


def replay(store: AggregateStore, at: int, vnodes: Sequence[int],
           signed: Callable[[int, int], pa.Table]) -> list[int] | None:
    """The group state brought to ``at`` in memory when this process does not hold it
    there and the state table is behind (a barrier that skipped its state commit ran in
    another process, or this one lost it): the change range (c, at] (``signed``: a range's
    signed rows) from the table's checkpoint c into the whole state, the next commit a
    checkpoint; [c, at] when it replayed."""
    uri = store.table(STATE).uri
    if current(uri, store.snapshot(STATE), at) is not None:
        return None
    c = store.txn_version(STATE, vnodes)
    if c is None or c >= at:
        return None
    changes = signed(c, at)
    t = store.agg
    snap, whole = store.read(STATE, None)
    keys = group_texts(distinct_groups(changes, t), t)
    touched = pc.is_in(whole.column(GROUP_KEY), value_set=keys)
    new = keyed_state(t, whole.filter(touched), changes)
    rows = pa.concat_tables([whole.filter(pc.invert(touched)), new.cast(whole.schema)])
    start(uri, table_id(snap), snap.version, at, rows, (keys,), changes.num_rows, due=True)
    return [c, at]
