"""Every row of an aggregate MV's small tables (group state, MV, kept input when small) held
in the process between barriers, so a warm barrier reads no file to find its touched groups.

Why: a barrier's touched groups reach every vnode once a few thousand rows change (2,000
changes into 100k groups touch all 256), so a keyed read opens every file of the group state
and of the MV at each barrier, a cost of the tables, not of the change. The group state of
100k groups is a few MB: the process that wrote it keeps it.

Why it stays exact: an entry is the whole table at one version, keyed by the table's uri and
valid only for the table's id (a reset or a recreate makes a new one) and that version. It is
made by a read of the whole table, or brought forward by a commit this process made on top of
the version it held (the version directly after it: a commit that rebased past another
writer's is not held). Any other version of the table (another writer, a compaction this
process did not make, a crash and a recovery in another process) misses, and the barrier
reads the files, then holds what it read. A table too large for the bound is read as before.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets import storage
from backfill_assets.core.aggregate_definition import GROUP_KEY

HELD_ROWS = 4_000_000  # rows of one table held at most (a larger one is read by key)
READ_WHOLE_ROWS = 500_000  # a table read whole on a miss, whatever the barrier touches
_CHUNKS = 16  # a held table's chunks (one per commit) before they are joined into one
_HELD_BYTES = 512 << 20


@dataclass(frozen=True)
class Held:
    """One table's rows at one version (the schema the store reads it as)."""

    table_id: str
    version: int
    rows: pa.Table


_HELD: storage.LRU[str, Held] = storage.LRU(16, name="aggregate tables held",
                                            weight=lambda h: h.rows.nbytes,
                                            max_weight=_HELD_BYTES)


def _uri(uri: str) -> str:
    return uri.rstrip("/")


def rows_at(uri: str, table_id: str, version: int) -> pa.Table | None:
    """Every row of the table at ``uri`` when this process holds it at that id and version."""
    found = _HELD.get(_uri(uri), valid=lambda h: h.table_id == table_id and h.version == version)
    return None if found is None else found.rows


def fits(live_rows: int) -> bool:
    """Whether a table of ``live_rows`` rows is held (else it is read by key every barrier)."""
    return live_rows <= HELD_ROWS


def read_whole(live_rows: int, touched_vnodes: int | None, vnode_count: int) -> bool:
    """Whether a barrier that finds nothing held reads the whole table (and holds it) rather
    than its touched vnodes (``touched_vnodes``; None: every row is wanted): when it fits,
    and the whole costs about what the touched vnodes would (a small table, or half its
    vnodes touched). A process per barrier (a sensor's runs) then never reads a large table
    whole to hold rows no later barrier of it will use."""
    return fits(live_rows) and (touched_vnodes is None or live_rows <= READ_WHOLE_ROWS
                                or 2 * touched_vnodes >= vnode_count)


def hold(uri: str, table_id: str, version: int, rows: pa.Table) -> None:
    """``rows``, every row of the table at ``version`` (read or written by this process)."""
    if fits(rows.num_rows):
        if rows.column(0).num_chunks > _CHUNKS:  # a filter then costs a call per chunk
            rows = rows.combine_chunks()
        _HELD.put(_uri(uri), Held(table_id, version, rows))


def forget(uri: str) -> None:
    _HELD.discard_where(lambda k: k == _uri(uri))


@dataclass(frozen=True)
class _Pick:
    """The rows of some groups taken from a held table (`of_groups`): which rows they were."""

    table_id: str
    version: int
    whole: weakref.ref  # the held rows they were taken from (not kept alive by the pick)
    keys: pa.Array
    rows: pa.ChunkedArray | pa.Array  # per held row, whether it is of one of ``keys``
    picked: pa.Table


def of_groups(uri: str, table_id: str, version: int, whole: pa.Table, keys: pa.Array
              ) -> pa.Table:
    """The rows of the groups ``keys`` in ``whole`` (the table held at ``version``). Which
    rows they were is kept until this process commits that table: the commit replaces
    exactly those groups (`committed`), and a second search of every held row for them cost
    as much as the first."""
    rows = pc.is_in(whole.column(GROUP_KEY), value_set=keys)
    picked = whole.filter(rows)
    _PICKS.put(_uri(uri), _Pick(table_id, version, weakref.ref(whole), keys, rows, picked))
    return picked


_PICKS: storage.LRU[str, _Pick] = storage.LRU(16, name="aggregate groups picked")


def committed(uri: str, table_id: str, base: int, version: int | None, before: pa.Table,
              after: pa.Table, read: pa.Table | None = None) -> None:
    """This process committed ``version`` on top of ``base``: the rows of the groups in
    ``before`` (every row the table held for them) replaced by ``after``. Held only when the
    table was held at ``base`` and the commit is the version right after it (a commit that
    rebased onto another writer's carries rows this process never saw). ``read``: ``before``
    as `of_groups` returned it, when it is that table (then its rows are known)."""
    prior = rows_at(uri, table_id, base)
    pick = _PICKS.pop(_uri(uri))
    if prior is None or version is None or version != base + 1:
        forget(uri)
        return
    if pick is not None and read is not None and pick.picked is read \
            and pick.whole() is prior and (pick.table_id, pick.version) == (table_id, base) \
            and pc.all(pc.is_in(after.column(GROUP_KEY), value_set=pick.keys),
                       min_count=0).as_py():
        # ``before`` is every held row of the picked groups, ``after`` only of those groups
        kept = prior.filter(pc.invert(pick.rows))
    else:
        touched = pc.unique(pa.chunked_array(
            [*before.column(GROUP_KEY).chunks, *after.column(GROUP_KEY).chunks],
            pa.string()))
        kept = prior.filter(pc.invert(pc.is_in(prior.column(GROUP_KEY), value_set=touched)))
    hold(uri, table_id, version, pa.concat_tables([kept, after.cast(prior.schema)]))


_FOLLOWERS: list[Callable[[str, str, int, int], None]] = []


def on_moved(follow: Callable[[str, str, int, int], None]) -> None:
    """``follow(uri, table_id, base, version)`` after each `moved` to the next version: for
    what else holds rows tied to a table's version (aggregate/checkpoint.py's state)."""
    _FOLLOWERS.append(follow)


def moved(uri: str, table_id: str, base: int, version: int | None) -> None:
    """A commit of this process that changed no row (a compaction) took the table from
    ``base`` to ``version``: what was held at ``base`` holds there too."""
    if version is not None and version == base + 1:
        for follow in _FOLLOWERS:
            follow(_uri(uri), table_id, base, version)
    prior = rows_at(uri, table_id, base)
    if prior is None or version is None or version != base + 1:
        forget(uri)
        return
    hold(uri, table_id, version, prior)


class TouchedVnodes(Sequence[int]):
    """The distinct vnodes of a barrier's touched groups, hashed on first use: only a read
    that misses the held rows opens files by vnode, so a warm barrier never hashes its
    touched groups (a hash per group, measurable in a small barrier: benchmarks/agg_phases.py)."""

    def __init__(self, compute: Callable[[], Sequence[int]]) -> None:
        self._compute, self._values = compute, None

    def _all(self) -> Sequence[int]:
        if self._values is None:
            self._values = list(self._compute())
        return self._values

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, i):  # type: ignore[override]
        return self._all()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())
