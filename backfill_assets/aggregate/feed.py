"""The upstream's change feed as an aggregate barrier reads it: a version range netted per
key, each key's pre-image and post-image, and a read of it begun before the barrier knows
where it starts.

Why begin early: reading a small barrier's change files is one of its largest serial steps,
and it needs only the upstream's log and the version the MV's progress is at. A process that
ran the MV's last barrier knows that version (`reached`), so once the barrier's own version
is known (the upstream checked), a thread reads (that version, the barrier's] while the
barrier opens its tables, reads its progress and makes its cost choice. The read is only a
guess until the progress says where the barrier starts: it is used when its range is the one
the barrier then asks for (a committed version range's change rows never change), and
dropped otherwise (another process moved the MV, a recovery, a recompute). It reads only
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


@dataclass
class Feed:
    """The change feed of the upstream ``upstream`` checked at the barrier's version."""

    tables: MVTables
    upstream: CheckedUpstream
    vnode_count: int
    early: tuple[int, int, Future[Early]] | None = None  # (at, to, its read)

    def begin(self, forced: str | None) -> None:
        """Start reading (the version this process's last barrier of the MV reached, the
        barrier's version] in the background (the module docstring); nothing when this
        process ran none or the upstream has not moved."""
        at, to = _REACHED.get(_key(self.tables.progress)), self.upstream.version
        if at is not None and at < to:
            self.early = (at, to, _READER.submit(self._read_early, at, to, forced))

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
        keep = [f.name for f in self.upstream.schema if f.name != VNODE]
        raw = storage.read_raw_changes(self.tables.upstream, at, to, keep,
                                       storage_options=self.tables.storage_options)
        return raw.select([*keep, "_change_type", "_commit_version"])

    def _read_early(self, at: int, to: int, forced: str | None) -> Early:
        so = self.tables.storage_options
        changes = sum(storage.estimate_change_rows(self.tables.upstream, at, to, so).values())
        return changes, self._raw(at, to) if cost.surely_applies(changes, forced) else None

    def _early(self, at: int, to: int) -> Early | None:
        """The early read when it is of (at, to] and succeeded (a failed one is read again
        in the barrier's thread, which raises its named error there; one still queued
        behind another barrier's dropped read is cancelled and read here)."""
        if self.early is None or self.early[:2] != (at, to):
            return None
        if self.early[2].cancel():  # not begun (behind a dropped one): read here instead
            self.early = None
            return None
        try:
            return self.early[2].result()
        except Exception:  # noqa: BLE001 - read again where the barrier sees the error
            return None


def reached(progress_uri: str, version: int) -> None:
    """This process's barrier brought the MV whose progress table is ``progress_uri`` to
    ``version`` (the next barrier's early read starts there)."""
    _REACHED.put(_key(progress_uri), version)


def _key(uri: str) -> str:
    return uri.rstrip("/")


# progress table uri -> the version this process's last barrier of the MV brought it to
_REACHED: storage.LRU[str, int] = storage.LRU(64, name="aggregate barriers reached")
_READER = ThreadPoolExecutor(1, thread_name_prefix="aggregate-feed")
