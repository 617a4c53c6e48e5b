"""Every column name the platform adds to a user's rows, in one place.

Why one place and one prefix: a step carries helper columns beside the upstream's own (the
netted operation, the filter verdict, a row's rank in its chunk, joined positions ...). When
those had short names (`_op`, `_rn`, `_keep`), an upstream column of the same name broke a
barrier with a raw Spark error. Now every helper column starts with INTERNAL_PREFIX, and a
definition whose upstream or output columns start with it is refused before anything is
written (`name_problems`), so a collision cannot happen. Names the platform does not choose
are refused by name too: the change data feed's own columns (delta-rs adds them to every
change row) and the `vnode` column the platform computes.
"""

from __future__ import annotations

from collections.abc import Iterable

INTERNAL_PREFIX = "__bf_"

OP = f"{INTERNAL_PREFIX}op"  # a netted change: 'upsert' | 'delete'
RANK = f"{INTERNAL_PREFIX}rank"  # netting: 0 for an insert/postimage, 1 for a delete/preimage
ROW_NUMBER = f"{INTERNAL_PREFIX}rn"  # netting, and a row's rank inside its vnode's chunk
KEEP = f"{INTERNAL_PREFIX}keep"  # the MV filter's verdict on a row
BAD_KEY = f"{INTERNAL_PREFIX}bad_key"  # a null pk, or the previous row's pk
POSITION = f"{INTERNAL_PREFIX}pos_"  # prefix of the joined position columns
EVERY = f"{INTERNAL_PREFIX}pos_every"  # the joined vnode admits every row
POSITION_VNODE = f"{INTERNAL_PREFIX}pos_vnode"
TOP = f"{INTERNAL_PREFIX}top"  # chunk stats: highest rank per vnode
BAD = f"{INTERNAL_PREFIX}bad"  # chunk stats: any bad key per vnode
ROW_ID = f"{INTERNAL_PREFIX}row_id"  # the oracle's row identity
SEEN = f"{INTERNAL_PREFIX}seen"  # duplicate check: rows per key
FILE = f"{INTERNAL_PREFIX}file"  # storage: the file a row was read from (path as in the log)
ROW = f"{INTERNAL_PREFIX}row"  # storage: a row's physical index in that file
OLD = f"{INTERNAL_PREFIX}old"  # storage merge: the row as it was
NEW = f"{INTERNAL_PREFIX}new"  # storage merge: the row as it becomes
SAME = f"{INTERNAL_PREFIX}same"  # storage merge: the change leaves the row as it was
REPLICA_VERSION = f"{INTERNAL_PREFIX}replica_version"  # replica: the version a row is as of
REPLICA_DELETED = f"{INTERNAL_PREFIX}replica_deleted"  # replica: the key is gone at that version

VNODE = "vnode"
CHANGE_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def is_internal(name: str) -> bool:
    return name.lower().startswith(INTERNAL_PREFIX)


def name_problems(upstream_columns: Iterable[str], output_columns: Iterable[str]) -> list[str]:
    """Why these upstream and MV output column names cannot be carried (empty: they can)."""
    out = []
    internal = sorted({n for n in [*upstream_columns, *output_columns] if is_internal(n)})
    if internal:
        out.append(
            f"columns {internal} start with {INTERNAL_PREFIX!r}, the prefix the platform "
            "reserves for its own helper columns: rename them (in the upstream, or give the "
            "computed column another name)"
        )
    feed = sorted({n for n in [*upstream_columns, *output_columns]
                   if n.lower() in CHANGE_FEED_COLUMNS})
    if feed:
        out.append(
            f"columns {feed} have the names of the Delta change data feed's own columns "
            f"{list(CHANGE_FEED_COLUMNS)}, which every change row carries: rename them in the "
            "upstream (or give the computed column another name)"
        )
    return out
