"""Reading and writing the `backfill_progress` table, and recovering a half-done step.

A step commits the MV first (carrying the progress it made as commit metadata, tagged with the
app transaction `{mv}/mv/{vnode}`) and the progress table second. If the process dies between
the two, the MV's app-transaction version for a vnode is newer than the version the progress
table records; the progress is then taken from that MV commit, so nothing is lost or repeated.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable

from backfill_assets import mv_store
from backfill_assets.arrow_types import schema_of
from backfill_assets.core import codec
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.progress import BackfillState
from backfill_assets.delta_store import arrow_schema
from backfill_assets.errors import CorruptProgressRow


def progress_schema(key_order: KeyOrder) -> pa.Schema:
    """Arrow schema of the progress table, from the one codec."""
    return schema_of(codec.progress_schema(key_order))


def read_progress(table: DeltaTable, key_order: KeyOrder, vnodes: Sequence[int]) -> dict:
    """Decoded progress rows of `vnodes`: vnode -> (progress, version)."""
    codec.validate_schema(arrow_schema(table).names, key_order)
    rows = mv_store.read_rows(table, vnodes).to_pylist()
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
                  progress_table: DeltaTable, mv: DeltaTable) -> tuple[BackfillState, list[int]]:
    """The committed state of `vnodes`, completed from an MV commit whose progress commit died."""
    recovered = read_progress(progress_table, key_order, vnodes)
    mv_done = mv_store.txn_versions(mv, mv_name, "mv", vnodes)
    redone: list[int] = []
    for vnode, version in mv_done.items():
        known = recovered.get(vnode, (None, None))[1]
        if version is None or (known is not None and version <= known):
            continue
        step = mv_store.step_metadata(mv, version, vnode)
        if step is None:
            raise CorruptProgressRow(
                f"{mv.table_uri} was committed for vnode {vnode} at upstream version {version} "
                "but neither the progress table nor the MV's commit history records that "
                "step's progress (history cleaned up?); rebuild the MV from scratch"
            )
        row = codec.from_json(step["progress"][str(vnode)], key_order)
        if row is not None:
            _, progress, at = codec.decode(row, key_order)
            recovered[vnode] = (progress, at)
        redone.append(vnode)
    return BackfillState(key_order, vnodes, recovered), redone


def write_progress(table: DeltaTable, state: BackfillState, key_order: KeyOrder, mv_name: str,
                   vnodes: Sequence[int], version: int) -> None:
    """Commit the progress of `vnodes` (one row per started vnode) and mark it committed."""
    if not state.commit_plan():
        return
    rows = [codec.encode(v, state.current(v), version, key_order) for v in vnodes]
    rows = [r for r in rows if r is not None]
    arrow = pa.Table.from_pylist(rows, schema=progress_schema(key_order))
    mv_store.overwrite_vnodes(table, arrow, mv_name=mv_name, phase="progress", vnodes=vnodes,
                              version=version)
    state.mark_committed()
