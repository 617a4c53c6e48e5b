"""A keyed commit as a copy-on-write of the whole table, from every row the caller holds: for
a small table whose barrier changes a large share of its keys.

Why: a keyed commit by deletion vectors (``keyed.locate``) looks up every changed key in the
key columns of the files whose statistics admit it. An aggregate MV's barrier touches groups
in every vnode, so it meets every file, and at a tenth of the groups or more it also puts a
DV on every file, which makes compaction due every barrier or two (a rewrite of most of the
table in the background, contending with the next barrier for the cores). When the caller
holds every live row of the table at the version (an aggregate's held rows,
aggregate/held.py, valid for one table id and version), the table can instead be written
anew: the held rows without the changed keys plus their new rows, sorted by (vnode, key),
every old file removed, no DV, nothing left to compact; what Delta's MERGE does when it
rewrites files. ``pays`` is the cost rule that picks it per commit.

Why it stays exact: the held rows must be the table (their count is checked against the
log's live rows), the change must agree with them as the lookup path checks it against the
files (every key ``before`` names held exactly once, no key only ``after`` names held:
``keyed.check_agrees``), and the change-data file holds exactly the changed keys' rows
(update pre/post images, inserts, deletes), as the DV path's does, so a reader of the change
feed (ours, Delta-Spark, delta-rs) reads the same rows whichever way the commit went; the
removes and adds carry no change rows where a change file exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows.keyed import KeyedRows, Located, check_agrees
from backfill_assets.storage.rows.row_equality import unchanged_dropped
from backfill_assets.storage.rows.scan import ROW_COLUMN

REWRITE_ROWS = 1_000_000  # live rows of a table rewritten on the driver, at most
# changed keys per live row from which a rewrite costs less than the lookups and DVs (the
# lookup's set lookups cover every file's keys once changes reach every vnode, so both costs
# grow with the table; the rewrite also saves the compaction its DVs make due)
REWRITE_SHARE = 0.05
COMMIT_KIND = "backfill.keyedCommit"  # commitInfo: "rewrite" when a commit took this path


@dataclass(frozen=True)
class Rewrite:
    """A planned rewrite: the changed keys' rows on both sides (for the change file) and
    every live row of the table after the commit."""

    located: Located
    rows: pa.Table


def pays(live_rows: int, changed_keys: int) -> bool:
    """Whether a table of ``live_rows`` rows whose commit changes ``changed_keys`` keys is
    rewritten rather than given DVs (the module docstring)."""
    return 0 < live_rows <= REWRITE_ROWS and changed_keys >= REWRITE_SHARE * live_rows


def plan(snap: TableVersion, key_names: Sequence[str], rows: KeyedRows,
         whole: pa.Table) -> Rewrite | None:
    """The rewrite of ``snap`` by ``rows`` given ``whole`` (every live row of ``snap``), or
    None when the commit takes the DV path: not one key column, ``whole`` is not the
    table's row count, nothing changes, or ``pays`` says no. ``StorageMismatch`` when the
    change disagrees with the rows (nothing is written)."""
    if len(key_names) != 1 or whole.num_rows != snap.live_rows \
            or not pays(snap.live_rows, max(rows.before.num_rows, rows.after.num_rows)):
        return None
    schema, key = snap.arrow_schema, key_names[0]
    before, after = unchanged_dropped(rows.before.select(schema.names).cast(schema),
                                      rows.after.select(schema.names).cast(schema), key_names)
    if not (before.num_rows or after.num_rows):
        return None
    whole = whole.select(schema.names).cast(schema)
    touched = pa.chunked_array([*before.column(key).chunks, *after.column(key).chunks],
                               schema.field(key).type).combine_chunks()
    held = pc.is_in(whole.column(key), value_set=touched)
    found = whole.select([key]).filter(held)
    check_agrees(snap.uri, key_names, before,
                 found.append_column(ROW_COLUMN, pa.array(np.arange(found.num_rows))))
    kept = whole.filter(pc.invert(held))
    return Rewrite(Located(before, after, {}, before.num_rows),
                   pa.concat_tables([kept, after]))
