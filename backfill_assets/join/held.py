"""A join MV's dimension tables held whole in the process between barriers, so a fact
barrier's lookup reads no dimension file.

Why: the customers of 20,000 changed orders (a 0.1% fact barrier at 20M) reach every vnode
and every row group of a 1M-row dimension, so a read by key or by vnode reads the whole
dimension at every barrier; a dimension is small (the benchmark's: 1M rows, about 30 MB of
Arrow), and the process that wrote it keeps it. The index is not held: it is as large as the
fact table, and a dimension barrier reads only its keys' groups of it (docs/JOINS.md).

Why it stays exact (the rule of branch join-state's held tables): an entry is a whole table
at one Delta version, valid only for the table's id (a reset or a recreate makes a new one)
and that version. It is made by a read of the whole table, or brought forward by a commit
this process made directly on top of the version it held. Any other version (a crash
recovered in another process, a recovery reading the version before a commit) misses, and
the barrier reads the files.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from backfill_assets import storage

HELD_ROWS = 5_000_000  # a dimension larger than this is read by key at every barrier
HELD_BYTES = 1 << 30


class _Entry:
    """One table's rows at one (table id, version)."""

    def __init__(self, table_id: str, version: int, rows: pa.Table) -> None:
        self.table_id, self.version, self.rows = table_id, version, rows


_HELD: storage.LRU[str, _Entry] = storage.LRU(16, name="join dimensions held",
                                              weight=lambda e: e.rows.nbytes,
                                              max_weight=HELD_BYTES)


def _table_id(snap: storage.TableVersion) -> str:
    return snap.table.metadata().id


def rows_at(snap: storage.TableVersion) -> pa.Table | None:
    """Every row of the table at ``snap`` when this process holds it at that id and
    version, else None."""
    tid, version = _table_id(snap), snap.version
    found = _HELD.get(snap.uri.rstrip("/"),
                      valid=lambda e: e.table_id == tid and e.version == version)
    return None if found is None else found.rows


def holds_whole(snap: storage.TableVersion) -> bool:
    """Whether a read of the table should read it whole and hold it (small enough)."""
    return snap.live_rows <= HELD_ROWS


def hold(snap: storage.TableVersion, rows: pa.Table) -> None:
    """``rows``: every row of the table at ``snap``, read by this process."""
    _HELD.put(snap.uri.rstrip("/"), _Entry(_table_id(snap), snap.version,
                                           rows.combine_chunks()))


def committed(snap: storage.TableVersion, version: int | None, key: Sequence[str],
              before: pa.Table, after: pa.Table) -> None:
    """This process committed ``version`` on top of ``snap``, replacing the rows of the
    keys in ``before`` or ``after`` by ``after``: the held rows brought forward, or dropped
    when they were not held at ``snap`` or the commit is not the version right after."""
    prior = rows_at(snap)
    uri = snap.uri.rstrip("/")
    if prior is None or version is None or version != snap.version + 1:
        _HELD.discard_where(lambda k: k == uri)
        return
    if before.num_rows == 0 and after.num_rows == 0:  # a commit of the pair alone
        _HELD.put(uri, _Entry(_table_id(snap), version, prior))
        return
    touched = pa.concat_tables([before.select(list(key)).cast(prior.select(list(key)).schema),
                                after.select(list(key)).cast(prior.select(list(key)).schema)])
    kept = prior.join(touched.group_by(list(key), use_threads=False).aggregate([]),
                      keys=list(key), join_type="left anti", use_threads=False)
    rows = pa.concat_tables([kept.select(prior.schema.names),
                             after.select(prior.schema.names).cast(prior.schema)])
    _HELD.put(uri, _Entry(_table_id(snap), version, rows.combine_chunks()))
