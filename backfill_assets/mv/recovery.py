"""Reading and writing the `backfill_progress` table, and recovering a half-done step.

A step commits the MV first (carrying the progress it made as commit metadata, tagged with the
app transaction `{mv}/mv/{vnode}`) and the progress table second. If the process dies between
the two, the MV's last commit for a vnode is ahead of the progress table: its app-transaction
version is newer, or - for a second barrier at the same upstream version (an idle upstream, a
re-executed run) - the version is the same but the progress it carries is further. The progress
is then taken from that MV commit, so nothing is lost or repeated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from backfill_assets.arrow.types import schema_of
from backfill_assets.core import codec
from backfill_assets.core.errors import ConcurrentBackfillRun, CorruptProgressRow
from backfill_assets.core.figures import FINISHED, IN_PROGRESS
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.progress import BackfillState, Completed, InProgress, NotStarted
from backfill_assets.mv import commit_later, owned_tables
from backfill_assets.storage import LRU, arrow_schema


def progress_schema(key_order: KeyOrder) -> pa.Schema:
    """Arrow schema of the progress table, from the one codec."""
    return schema_of(codec.progress_schema(key_order))


def read_progress(table: DeltaTable, key_order: KeyOrder, vnodes: Sequence[int]) -> dict:
    """Decoded progress rows of `vnodes`: vnode -> (progress, version)."""
    codec.validate_schema(arrow_schema(table).names, key_order)
    rows = _known_rows(table, vnodes)
    if rows is None:
        rows = owned_tables.read_rows(table, vnodes).to_pylist()
        _remember(table, table.version(), vnodes, rows)
    out: dict = {}
    for row in rows:
        vnode, progress, version = codec.decode(row, key_order)
        if vnode in out:
            raise CorruptProgressRow(
                f"{table.table_uri} holds two progress rows for vnode {vnode}; the table was "
                "edited by hand: restore it from its Delta history (RESTORE) or drop the MV state"
            )
        out[vnode] = (progress, version)
    return out


def recover_state(mv_name: str, key_order: KeyOrder, vnodes: Sequence[int],
                  progress_table: DeltaTable, mv: DeltaTable,
                  storage_options: Mapping[str, str] | None = None
                  ) -> tuple[BackfillState, list[int]]:
    """The committed state of `vnodes`, completed from an MV commit whose progress commit died.
    A function of the two tables' versions: a barrier that recovers twice at the same versions
    (snapshot mode plans its steps from it, then the step opens) reads the tables once."""
    key = _recovery_key(progress_table, mv, mv.version(), mv_name, key_order, vnodes)
    known = _RECOVERED.get(key)
    if known is None:
        recovered, redone = _recover(mv_name, key_order, vnodes, progress_table, mv,
                                     storage_options)
        known = (BackfillState(key_order, vnodes, recovered), redone)
        _RECOVERED.put(key, known)
    state, redone = known
    return state.copy(), list(redone)


def remember_step(progress_table: DeltaTable, mv: DeltaTable, mv_version: int, mv_name: str,
                  key_order: KeyOrder, vnodes: Sequence[int]) -> None:
    """After a step's MV commit (the MV at `mv_version`) and its progress commit (the
    progress table brought to it): what `recover_state` at those two versions returns,
    without reading either table, so the next barrier of a warm loop recovers for free. It
    is the progress rows the commit wrote (as a read returns them) with nothing redone: the
    MV's newest commit for these vnodes carries that same progress. Kept only when the
    progress commit was the table's next version (its rows are known) and every vnode has a
    row (a vnode not started has none, and a fresh recovery counts the MV commit's app
    transaction for it as redone); any other commit to either table moves a version and
    misses the entry."""
    rows = _known_rows(progress_table, vnodes)
    if rows is None or len(rows) != len(vnodes):
        return
    recovered = {}
    for row in rows:
        vnode, progress, version = codec.decode(row, key_order)
        recovered[vnode] = (progress, version)
    _RECOVERED.put(_recovery_key(progress_table, mv, mv_version, mv_name, key_order, vnodes),
                   (BackfillState(key_order, vnodes, recovered), []))


def _recovery_key(progress_table: DeltaTable, mv: DeltaTable, mv_version: int, mv_name: str,
                  key_order: KeyOrder, vnodes: Sequence[int]) -> tuple:
    return (progress_table.table_uri, progress_table.metadata().id, progress_table.version(),
            mv.table_uri, mv.metadata().id, mv_version, mv_name, repr(key_order),
            tuple(vnodes))


# the last few recoveries, by the versions (and ids) of the tables they read
_RECOVERED: LRU[tuple, tuple[BackfillState, list[int]]] = LRU(8, name="recoveries")


def _recover(mv_name: str, key_order: KeyOrder, vnodes: Sequence[int],
             progress_table: DeltaTable, mv: DeltaTable,
             storage_options: Mapping[str, str] | None) -> tuple[dict, list[int]]:
    recovered = read_progress(progress_table, key_order, vnodes)
    mv_done = owned_tables.txn_versions(mv, mv_name, "mv", vnodes, storage_options)
    known = {v: recovered.get(v, (NotStarted(), None)) for v in vnodes}
    # an MV commit at the progress table's own version may still be ahead of it (a second
    # step at the same upstream version): look at what it carries, not only at its version
    candidates = {v: ver for v, ver in mv_done.items()
                  if ver is not None and (known[v][1] is None or ver >= known[v][1])}
    steps = owned_tables.find_steps(mv, candidates)
    redone: list[int] = []
    for vnode, version in candidates.items():
        progress, at = known[vnode]
        step = steps.get(vnode)
        if step is None:
            if version == at:
                continue  # history too short to tell: the table is the newest we can see
            raise CorruptProgressRow(
                f"{mv.table_uri} was committed for vnode {vnode} at upstream version {version} "
                "but neither the progress table nor any commit in the MV's whole history "
                "records that step's progress (the log was cleaned up, e.g. by log retention): "
                "rebuild the MV with reset_mv_job"
            )
        row = codec.from_json(step["progress"][str(vnode)], key_order)
        carried = codec.decode(row, key_order)[1:] if row is not None else None
        if version == at and (carried is None or not _ahead(carried[0], progress, key_order)):
            continue
        if carried is not None:
            recovered[vnode] = carried
        redone.append(vnode)
    return recovered, redone


def _ahead(new, old, key_order: KeyOrder) -> bool:
    """Whether progress `new` is strictly further than `old` (positions only grow)."""
    rank = {NotStarted: 0, InProgress: 1, Completed: 2}
    if rank[type(new)] != rank[type(old)]:
        return rank[type(new)] > rank[type(old)]
    return isinstance(new, InProgress) and key_order.compare(new.current_pos, old.current_pos) > 0


def progress_rows(state: BackfillState, vnodes: Sequence[int], version: int,
                  key_order: KeyOrder) -> list[dict | None]:
    """Each vnode's progress row at ``version`` (None: not started, no row): what an MV commit
    carries and the progress commit after it writes (encoded once for both)."""
    return [codec.encode(v, state.current(v), version, key_order) for v in vnodes]


def write_progress(table: DeltaTable, state: BackfillState, key_order: KeyOrder, mv_name: str,
                   vnodes: Sequence[int], version: int, force: bool = False,
                   storage_options: Mapping[str, str] | None = None,
                   rows: Sequence[dict | None] | None = None,
                   extra: Mapping[str, int] | None = None) -> None:
    """Commit the progress of `vnodes` (one row per started vnode) and mark it committed;
    `force`: even when nothing moved (progress recovered from an MV commit must land);
    `rows`: `progress_rows` of this state, when the caller has them already; ``extra``: more
    app transactions the commit carries (a join's dimension versions: join/store.py)."""
    if not state.commit_plan() and not force:
        return
    if rows is None:
        rows = progress_rows(state, vnodes, version, key_order)
    rows = [r for r in rows if r is not None]
    arrow = pa.Table.from_pylist(rows, schema=progress_schema(key_order))
    before = table.version()
    after = owned_tables.overwrite_vnodes(table, arrow, mv_name=mv_name, phase="progress",
                                      vnodes=vnodes, version=version,
                                      storage_options=storage_options, extra=extra)
    _written(table, before, after, vnodes, arrow)
    state.mark_committed()


def write_progress_later(uri: str, table: DeltaTable, state: BackfillState, key_order: KeyOrder,
                         mv_name: str, vnodes: Sequence[int], version: int, *,
                         storage_options: Mapping[str, str] | None = None,
                         hook: Callable[[str], None] = lambda _: None,
                         extra: Mapping[str, int] | None = None) -> None:
    """`write_progress` (forced) of the table at ``uri`` by a background thread, for a
    barrier whose other tables hold it already (mv/commit_later.py: why it is safe, and
    what waits for it); ``hook`` is called at `before_progress_commit` and
    `after_progress_commit` around it, in that thread; ``extra``: as `write_progress`'s."""
    def commit() -> None:
        hook("before_progress_commit")
        write_progress(table, state, key_order, mv_name, vnodes, version, force=True,
                       storage_options=storage_options, extra=extra)
        hook("after_progress_commit")

    commit_later.commit_later(uri, commit)


# The progress rows this process last saw, per table: (uri, table id) -> (version, vnode ->
# rows). A barrier would otherwise read them back (a read of the progress table) at the
# version its previous barrier committed; when that commit was the only one since the rows
# were read (the table's version moved by exactly one), the rows it wrote are that version's.
_PROGRESS_ROWS: LRU[tuple[str, str], tuple[int, dict[int, list[dict]]]] = LRU(
    16, name="progress rows")


def _key(table: DeltaTable) -> tuple[str, str]:
    return table.table_uri, table.metadata().id


def _known_rows(table: DeltaTable, vnodes: Sequence[int]) -> list[dict] | None:
    version, known = _PROGRESS_ROWS.get(_key(table)) or (None, {})
    if version != table.version() or any(v not in known for v in vnodes):
        return None
    return [dict(row) for v in vnodes for row in known[v]]


def _remember(table: DeltaTable, version: int, vnodes: Sequence[int], rows: list[dict]) -> None:
    known: dict[int, list[dict]] = {v: [] for v in vnodes}
    for row in rows:
        known.setdefault(row[codec.VNODE], []).append(dict(row))
    _PROGRESS_ROWS.put(_key(table), (version, known))


def _written(table: DeltaTable, before: int, after: int, vnodes: Sequence[int],
             arrow: pa.Table) -> None:
    """After our overwrite of `vnodes` (version `before` -> `after`): the rows of the new
    version, when it is known."""
    key = _key(table)
    version, known = _PROGRESS_ROWS.pop(key) or (None, {})
    if version != before or after != before + 1:
        return  # not seen before, or another commit landed in between: read it next time
    now = {v: rows for v, rows in known.items() if v not in vnodes}
    now.update({v: [] for v in vnodes})
    for row in arrow.cast(arrow_schema(table)).to_pylist():  # as a read returns them
        now[row[codec.VNODE]].append(row)
    _PROGRESS_ROWS.put(key, (before + 1, now))


def vnode_states(tables: owned_tables.MVTables) -> dict[int, str]:
    """vnode -> finished / in progress, as the progress table records them (a vnode without a
    progress row has not started): what the figures, the jobs and a re-snapshot's checks read
    without recovering anything."""
    progress = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    if progress is None:
        return {}
    rows = owned_tables.read_rows(progress, None, [codec.VNODE, codec.FINISHED]).to_pylist()
    return {r[codec.VNODE]: FINISHED if r[codec.FINISHED] else IN_PROGRESS for r in rows}


def unfinished_vnodes(progress_table, key_order, vnodes: set[int]) -> set[int]:
    """Of ``vnodes``, those the progress table does not record as Completed."""
    done = read_progress(progress_table, key_order, sorted(vnodes))
    return {v for v in vnodes if not isinstance(done.get(v, (None,))[0], Completed)}


def refuse_stale(state: BackfillState, vnodes: Sequence[int], v_new: int, where: str) -> None:
    """A step planned at ``v_new`` for vnodes another run already moved past it."""
    ahead = [v for v in vnodes if (state.version(v) or -1) > v_new]
    if ahead:
        raise ConcurrentBackfillRun(
            f"vnodes {ahead[:8]} of {where} are already at a version newer than {v_new}: "
            "another run got there first; rerun this barrier against the latest upstream version"
        )


def step_json(state: BackfillState, vnodes: Sequence[int], v_new: int, key_order,
              rows: Sequence[dict | None] | None = None) -> str:
    """The progress this MV commit makes, so a crash before the progress commit loses nothing
    (`rows`: `progress_rows` of this state, when the caller has them already)."""
    if rows is None:
        rows = progress_rows(state, vnodes, v_new, key_order)
    body = {str(v): codec.to_json(row, key_order) for v, row in zip(vnodes, rows, strict=True)}
    return json.dumps({"version": v_new, "progress": body})
