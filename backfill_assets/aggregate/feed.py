"""The upstream's change feed as an aggregate barrier reads it: a version range netted per
key, each key's pre-image and post-image, and a read of it begun before the barrier knows
where it starts.

Why begin early: reading a small barrier's change files is one of its largest serial steps,
and it needs only the upstream's log and the version the MV's progress is at. A process that
ran the MV's last barrier knows that version and the columns it read (`reached`), so as
the barrier starts (one listing of the upstream's log gives its version), a thread reads
(that version, the barrier's] while the barrier checks the upstream, opens its tables, reads
its progress and makes its cost choice. The read is only a guess until the progress says
where the barrier starts and the check says what it reads: it is used when its range and
columns are the ones the barrier then asks for (a committed version range's change rows
never change), and dropped otherwise (another process moved the MV, a recovery, a
recompute, a new upstream commit between the listing and the check). It reads only
when the cost model applies the range whatever the upstream's size (`cost.surely_applies`),
so a catch-up that will recompute never reads its changes for nothing; its estimate of the
range's rows is the choice's own.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.aggregate import cost
from backfill_assets.arrow import netting
from backfill_assets.core.names import VNODE
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.key_checks import check_change_keys
from backfill_assets.step.preflight import CheckedUpstream

# (change rows estimated, the raw change rows or None: not read, the cost may recompute)
Early = tuple[int, pa.Table | None]


@dataclass(frozen=True)
class EarlyRead:
    """A read of (at, to] of ``columns`` begun in the background."""

    at: int
    to: int
    columns: tuple[str, ...]
    read: Future[Early]


def begin(tables: MVTables, version: int | None, forced: str | None) -> EarlyRead | None:
    """Start reading (the version this process's last barrier of the MV reached, the
    barrier's version: ``version``, else the upstream's latest] in the background (the
    module docstring), before the upstream is checked: the columns are the ones the last
    barrier read, and a read whose range or columns are not the barrier's is dropped.
    None when this process ran no barrier of the MV or the upstream has not moved."""
    known = _REACHED.get(_key(tables.progress))
    if known is None:
        return None
    at, columns = known
    try:
        to = version if version is not None else \
            storage.latest_version(tables.upstream, tables.storage_options)
    except Exception:  # noqa: BLE001 - the upstream's check names what is wrong
        return None
    if at >= to:
        return None
    return EarlyRead(at, to, columns, _READER.submit(_read_early, tables, at, to, columns,
                                                     forced))


@dataclass
class Feed:
    """The change feed of the upstream ``upstream`` checked at the barrier's version."""

    tables: MVTables
    upstream: CheckedUpstream
    vnode_count: int
    early: EarlyRead | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The upstream columns a change row carries (the ones the MV reads)."""
        return tuple(f.name for f in self.upstream.schema if f.name != VNODE)

    def change_rows(self, at: int, to: int) -> int:
        """The range's change rows, estimated from the upstream's log."""
        early = self._early(at, to)
        if early is not None:
            return early[0]
        so = self.tables.storage_options
        return sum(storage.estimate_change_rows(self.tables.upstream, at, to, so).values())

    def netted(self, at: int, to: int, upstream_vnodes: bool = True) -> netting.Netted:
        """The upstream's change range (at, to] netted per key: each key's pre-image at
        ``at`` and post-image at ``to`` (the row MV's driver netting), with the upstream's
        vnode (``upstream_vnodes`` False: 0, for a barrier that reads no vnode of an
        upstream row: the key hash is a Python call per change row)."""
        early = self._early(at, to)
        raw = early[1] if early is not None and early[1] is not None else self._raw(at, to)
        key_names = list(self.upstream.key_order.names)
        check_change_keys(raw, key_names, self.tables.upstream)
        if upstream_vnodes:
            raw = netting.with_vnode(raw, key_names, self.upstream.key_types, self.vnode_count)
        else:
            raw = raw.append_column(VNODE, pa.repeat(pa.scalar(0, pa.int32()), raw.num_rows))
        return netting.net_with_prior(raw, key_names, checked=True)

    def read_early(self, at: int, to: int) -> bool:
        """Whether the rows of (at, to] came from the early read."""
        early = self._early(at, to)
        return early is not None and early[1] is not None

    def _raw(self, at: int, to: int) -> pa.Table:
        return _raw(self.tables, at, to, self.columns)

    def _early(self, at: int, to: int) -> Early | None:
        """The early read when it is of (at, to] and these columns and succeeded (a failed
        one is read again in the barrier's thread, which raises its named error there; one
        still queued behind another barrier's dropped read is cancelled and read here)."""
        early = self.early
        if early is None or (early.at, early.to, early.columns) != (at, to, self.columns):
            return None
        if early.read.cancel():  # not begun (behind a dropped one): read here instead
            self.early = None
            return None
        try:
            return early.read.result()
        except Exception:  # noqa: BLE001 - read again where the barrier sees the error
            return None


def _raw(tables: MVTables, at: int, to: int, columns: tuple[str, ...]) -> pa.Table:
    raw = storage.read_raw_changes(tables.upstream, at, to, list(columns),
                                   storage_options=tables.storage_options)
    return raw.select([*columns, "_change_type", "_commit_version"])


def _read_early(tables: MVTables, at: int, to: int, columns: tuple[str, ...],
                forced: str | None) -> Early:
    so = tables.storage_options
    changes = sum(storage.estimate_change_rows(tables.upstream, at, to, so).values())
    return changes, _raw(tables, at, to, columns) if cost.surely_applies(changes, forced) \
        else None


def reached(progress_uri: str, version: int, columns: tuple[str, ...]) -> None:
    """This process's barrier brought the MV whose progress table is ``progress_uri`` to
    ``version``, reading ``columns`` of the upstream (the next barrier's early read starts
    there, with those columns)."""
    _REACHED.put(_key(progress_uri), (version, columns))


def _key(uri: str) -> str:
    return uri.rstrip("/")


# progress table uri -> the version this process's last barrier of the MV brought it to, and
# the upstream columns it read
_REACHED: storage.LRU[str, tuple[int, tuple[str, ...]]] = storage.LRU(
    64, name="aggregate barriers reached")
_READER = ThreadPoolExecutor(1, thread_name_prefix="aggregate-feed")
