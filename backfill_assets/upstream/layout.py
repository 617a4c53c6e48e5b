"""What an upstream's log says about its layout and its keys, read without its file list.

Both decide how much a bulk or chunked read may skip: an upstream arranged by the MV's vnodes
(`same_vnodes`) is read in vnode-range tasks with no shuffle, and one whose every row came from
the platform's pk-enforcing writer (`keys_kept_unique`) needs no pass over its keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from backfill_assets import storage
from backfill_assets.storage import LRU


def same_vnodes(uri: str, version: int, key_names: Sequence[str], vnode_count: int,
                storage_options: Mapping[str, str]) -> bool:
    """Whether the upstream is a platform table arranged by the MV's vnodes (same pk, same
    count, partitioned by vnode): its files then hold one vnode each, and its writer keeps
    the pk unique and non-null (`upstream.writer.apply_dml`)."""

    table = storage.open_head(uri, version, storage_options)
    config = table.metadata().configuration
    try:
        pk = json.loads(config.get(storage.PK_PROPERTY) or "null")
    except ValueError:
        return False
    return (pk == list(key_names)
            and str(config.get(storage.VNODE_COUNT_PROPERTY)) == str(vnode_count)
            and storage.VNODE in storage.partition_columns(table))


# Operations that add no row another engine could have duplicated a key with.
_ROWLESS = frozenset({"CREATE TABLE", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "VACUUM START",
                      "VACUUM END", "OPTIMIZE", "DELETE", "ADD COLUMNS", "CHANGE COLUMN",
                      "ADD CONSTRAINT", "DROP CONSTRAINT", "UPGRADE PROTOCOL", "FSCK"})


def keys_kept_unique(uri: str, version: int, key_names: Sequence[str], vnode_count: int,
                     storage_options: Mapping[str, str]) -> bool:
    """Whether every row of the upstream up to `version` came from the platform's own writer
    (commits marked `backfill.dml`, on a table arranged by the MV's vnodes), which refuses null
    and duplicate pks: then a bulk read may skip the group-by over every key. A commit of
    another engine that adds rows (an append, a merge) makes the read check its keys. Commits
    older than the log's retention cannot be seen: their rows were checked or are as old as
    the table's own rows."""

    if not same_vnodes(uri, version, key_names, vnode_count, storage_options):
        return False
    table = storage.open_head(uri, version, storage_options)
    key = (uri, table.metadata().id)
    checked = _UNIQUE_UP_TO.get(key)
    checked = -1 if checked is None else checked  # versions already seen to be the platform's own
    if version <= checked:
        return True
    history = table.history(version - checked) if checked >= 0 else table.history()
    ok = all("backfill.dml" in c or c.get("operation") in _ROWLESS
             for c in history if checked < c.get("version", 0) <= version)
    if ok:
        _UNIQUE_UP_TO.put(key, version)
    return ok


# (uri, table id) -> newest version up to which every commit was seen to come from the
# platform's writer: a warm loop of barriers reads only the commits made since (the log is
# append-only; a table recreated at the same uri has a new id and is checked again)
_UNIQUE_UP_TO: LRU[tuple[str, str], int] = LRU(256, name="upstreams checked unique")
