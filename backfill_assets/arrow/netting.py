"""Change-feed rows netted on the driver (Arrow): the engine of a small barrier.

A barrier over finished vnodes with few changes should cost what changed. Its change rows are
already on the driver (the storage layer reads the feed as Arrow), so netting them there saves
the Spark jobs (a shuffle for the window, a collect of the keys) that dominate such a barrier.

A chunked barrier's forwarded changes take the same path when they are few: ``visible`` keeps
the rows each vnode's position already covers (the rule of
``engine.projection.visible_rows``), and for those keys the MV holds the row at the vnode's
version, which is what ``net_with_prior`` takes from the feed as the row before the range.

The rule is the one of ``netting.net_changes``: the last change of a key wins (highest
``_commit_version``; within one version an insert/update_postimage wins over a
delete/update_preimage). Netting here also yields what the Spark path reads from the MV
instead: the row each key held before the range, i.e. its first change when that is a delete
or a pre-image (a key whose first change is an insert did not exist). The storage layer then
only looks up where those keys live (``storage.rows.keyed``) and checks the table agrees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.changes import is_visible
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.names import RANK, ROW_NUMBER, VNODE
from backfill_assets.core.progress import Completed, InProgress, VnodeProgress
from backfill_assets.core.vnode import vnodes_of

CHANGE_TYPE, VERSION = "_change_type", "_commit_version"
UPSERT_TYPES = ("insert", "update_postimage")


def with_vnode(raw: pa.Table, key_names: Sequence[str], key_types: Sequence[str],
               vnode_count: int) -> pa.Table:
    """``raw`` with its ``vnode`` column computed from the key (``core.vnode``: the same value
    as the Spark expression of ``netting.with_vnode``)."""
    keys = list(zip(*(raw.column(k).to_pylist() for k in key_names), strict=True))
    vnodes = pa.array(vnodes_of(keys, key_types, vnode_count), pa.int32())
    if VNODE in raw.column_names:
        return raw.set_column(raw.schema.get_field_index(VNODE), VNODE, vnodes)
    return raw.append_column(VNODE, vnodes)


def newer_than(raw: pa.Table, since: Mapping[int, int]) -> pa.Table:
    """The rows of the vnodes in ``since`` newer than their vnode's version."""
    if not since or not raw.num_rows:
        return raw.slice(0, 0)
    lookup = np.full(max(max(since) + 1, 1), np.iinfo(np.int64).max, dtype=np.int64)
    for vnode, version in since.items():
        lookup[vnode] = version
    vnodes = raw.column(VNODE).to_numpy(zero_copy_only=False).astype(np.int64)
    inside = vnodes < len(lookup)
    floor = np.where(inside, lookup[np.minimum(vnodes, len(lookup) - 1)], np.iinfo(np.int64).max)
    versions = raw.column(VERSION).to_numpy(zero_copy_only=False).astype(np.int64)
    return _kept(raw, versions > floor)


def _kept(rows: pa.Table, mask: np.ndarray) -> pa.Table:
    """`rows` where `mask`; the table itself when every row is kept (the usual case of a
    barrier over finished vnodes: a filter copies every column)."""
    return rows if mask.all() else rows.filter(pa.array(mask))


def rows_by_keys(rows: pa.Table, keys: pa.Table, key_names: Sequence[str], how: str
                 ) -> pa.Table:
    """The rows of ``rows`` whose key is among ``keys``' (``how`` 'left semi') or not ('left
    anti'), in their order. Only the key columns and a row index go through the join: Arrow's
    join refuses a non-key column of type null (an upstream column never set), which a
    change row may well carry."""
    names = list(key_names)
    marker = "__bf_row"
    indexed = rows.select(names).append_column(marker, pa.array(np.arange(rows.num_rows)))
    hit = indexed.join(keys.select(names), names, join_type=how, use_threads=False)
    return rows.take(pa.array(np.sort(hit.column(marker).to_numpy(zero_copy_only=False))))


def visible(rows: pa.Table, progress: Mapping[int, VnodeProgress],
            key_order: KeyOrder) -> pa.Table:
    """The rows (with ``vnode``) each vnode's backfill already covers: every row of a Completed
    vnode (or one whose position is the empty vnode's placeholder), the rows of an InProgress
    vnode whose key is at or before its position (``core.changes.is_visible``: the core's key
    order), none of other vnodes. What ``engine.projection.visible_rows`` keeps, on the driver."""
    if not rows.num_rows:
        return rows
    vnodes = rows.column(VNODE).to_numpy(zero_copy_only=False)
    whole = [v for v, p in progress.items() if isinstance(p, Completed)
             or (isinstance(p, InProgress) and key_order.is_placeholder(p.current_pos))]
    at = {v: p for v, p in progress.items() if isinstance(p, InProgress) and v not in whole}
    mask = np.isin(vnodes, np.array(whole, dtype=vnodes.dtype))
    rows_at = np.flatnonzero(np.isin(vnodes, np.array(list(at), dtype=vnodes.dtype)))
    single = key_order.columns[0]
    if len(rows_at) and len(key_order.columns) == 1 and single.type in ("int", "bigint"):
        # one integer column: the same comparison as the core's, vectorised (keys non-null)
        pos = np.zeros(int(vnodes.max()) + 1, dtype=np.int64)
        for v, p in at.items():
            if v < len(pos):
                pos[v] = p.current_pos[0]
        keys = rows.column(single.name).to_numpy(zero_copy_only=False).astype(np.int64)
        held = pos[vnodes[rows_at]]
        mask[rows_at] = (keys[rows_at] >= held) if single.descending else (keys[rows_at] <= held)
    elif len(rows_at):
        picked = pa.array(rows_at)
        keys = zip(*(rows.column(k).take(picked).to_pylist() for k in key_order.names),
                   strict=True)
        for i, key in zip(rows_at, keys, strict=True):
            vnode = int(vnodes[i])
            mask[i] = is_visible(key, lambda _k, v=vnode: v, at, key_order)
    return _kept(rows, mask)


@dataclass(frozen=True)
class Netted:
    """The keys a change range touches: the row each held before the range (keys that
    existed), the row each holds after it (keys that exist), and how many keys changed. Rows
    have the feed's columns without ``_change_type`` / ``_commit_version`` /
    ``_commit_timestamp``."""

    before: pa.Table
    after: pa.Table
    keys: int


def net_with_prior(raw: pa.Table, key_names: Sequence[str], checked: bool = False) -> Netted:
    """Net ``raw`` per key (see the module docstring for the rule). ``checked``: the caller
    refused a key that one version inserts twice or deletes twice
    (`step.key_checks.check_change_keys`); a range of one version is then netted without a
    sort (below)."""
    data = [c for c in raw.column_names if not c.startswith("_commit") and c != CHANGE_TYPE]
    if not raw.num_rows:
        empty = raw.select(data).slice(0, 0)
        return Netted(empty, empty, 0)
    upsert = pc.is_in(raw.column(CHANGE_TYPE), pa.array(UPSERT_TYPES))
    if checked and _one_version(raw):
        # each key has at most one delete-side and one upsert-side row, so its first change
        # is its delete-side row and its last its upsert-side one: the rule without the sort
        # (the sort is most of the netting's cost; docs/AGGREGATES.md has the figure)
        keys = raw.select(list(key_names)).group_by(list(key_names), use_threads=False)
        return Netted(raw.filter(pc.invert(upsert)).select(data), raw.filter(upsert).select(data),
                      keys.aggregate([]).num_rows)
    ranked = raw.append_column(RANK, pc.cast(upsert, pa.int8()))  # delete 0, upsert 1
    ranked = ranked.append_column(ROW_NUMBER, pa.array(np.arange(raw.num_rows)))
    order = [*[(k, "ascending") for k in key_names], (VERSION, "ascending"),
             (RANK, "ascending"), (ROW_NUMBER, "ascending")]
    rows = ranked.take(pc.sort_indices(ranked, sort_keys=order))
    first, last = _group_edges(rows, key_names)
    firsts, lasts = rows.filter(first), rows.filter(last)
    before = firsts.filter(pc.equal(firsts.column(RANK), 0)).select(data)
    after = lasts.filter(pc.equal(lasts.column(RANK), 1)).select(data)
    return Netted(before, after, firsts.num_rows)


def _one_version(raw: pa.Table) -> bool:
    """Whether every row of ``raw`` is of one commit version."""
    bounds = pc.min_max(raw.column(VERSION)).as_py()
    return bounds["min"] == bounds["max"]


def inserted_keys(raw: pa.Table, key_names: Sequence[str]) -> pa.Table:
    """Keys some version inserts without deleting them in the same version (with the newest
    such version): how a second row for an existing key arrives from a writer that does not
    enforce the pk."""
    keys = list(key_names)
    upsert = pc.cast(pc.is_in(raw.column(CHANGE_TYPE), pa.array(UPSERT_TYPES)), pa.int8())
    sides = raw.select([*keys, VERSION]).append_column(RANK, upsert)
    per_version = sides.group_by([*keys, VERSION], use_threads=False).aggregate([(RANK, "min")])
    only_new = per_version.filter(pc.equal(per_version.column(f"{RANK}_min"), 1))
    return only_new.group_by(keys, use_threads=False).aggregate([(VERSION, "max")]).rename_columns(
        [*keys, VERSION])


def _group_edges(rows: pa.Table, key_names: Sequence[str]) -> tuple[pa.Array, pa.Array]:
    """Masks of each key group's first and last row in key-sorted ``rows`` (keys non-null:
    the change chunk's keys were checked before)."""
    n = rows.num_rows
    differs = np.zeros(max(n - 1, 0), dtype=bool)
    for k in key_names:
        col = rows.column(k)
        ne = pc.not_equal(col.slice(1), col.slice(0, n - 1))
        differs |= pc.fill_null(ne, True).to_numpy(zero_copy_only=False)
    first = np.concatenate([[True], differs])
    last = np.concatenate([differs, [True]])
    return pa.array(first), pa.array(last)
