"""The upstream's change feed as an aggregate barrier reads it: a version range netted per
key, each key's pre-image and post-image.

Why it is read in the barrier's own thread, after the cost choice, and not begun early beside
the upstream's check and the tables' opening: the read of many small change files holds the
GIL, so beside the opening it slows by about as much as it overlaps (docs/AGGREGATES.md, "The
barrier's serial path").
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.arrow import netting
from backfill_assets.core.names import VNODE
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.key_checks import check_change_keys
from backfill_assets.step.preflight import CheckedUpstream


@dataclass(frozen=True)
class Feed:
    """The change feed of the upstream ``upstream`` checked at the barrier's version."""

    tables: MVTables
    upstream: CheckedUpstream
    vnode_count: int

    @property
    def columns(self) -> tuple[str, ...]:
        """The upstream columns a change row carries (the ones the MV reads)."""
        return tuple(f.name for f in self.upstream.schema if f.name != VNODE)

    def change_rows(self, at: int, to: int) -> int:
        """The range's change rows, estimated from the upstream's log."""
        so = self.tables.storage_options
        return sum(storage.estimate_change_rows(self.tables.upstream, at, to, so).values())

    def netted(self, at: int, to: int, upstream_vnodes: bool = True) -> netting.Netted:
        """The upstream's change range (at, to] netted per key: each key's pre-image at
        ``at`` and post-image at ``to`` (the row MV's driver netting), with the upstream's
        vnode (``upstream_vnodes`` False: 0, for a barrier that reads no vnode of an
        upstream row: the key hash is a Python call per change row)."""
        columns = list(self.columns)
        raw = storage.read_raw_changes(self.tables.upstream, at, to, columns,
                                       storage_options=self.tables.storage_options)
        raw = raw.select([*columns, "_change_type", "_commit_version"])
        key_names = list(self.upstream.key_order.names)
        check_change_keys(raw, key_names, self.tables.upstream)
        if upstream_vnodes:
            raw = netting.with_vnode(raw, key_names, self.upstream.key_types, self.vnode_count)
        else:
            raw = raw.append_column(VNODE, pa.repeat(pa.scalar(0, pa.int32()), raw.num_rows))
        return netting.net_with_prior(raw, key_names, checked=True)
