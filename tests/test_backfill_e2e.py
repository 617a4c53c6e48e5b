"""End to end: real Spark, real Delta, the oracle after every barrier, both modes."""

from __future__ import annotations

import random

import pytest

from backfill_assets.mv_store import MVTables
from tests.support import LiveUpstream, drive, simple_mv, simple_row, simple_spec

MODES = ["arrangement", "no_shuffle"]


def _live(warehouse: str, vnode_count: int, seed: int) -> LiveUpstream:
    spec = simple_spec(vnode_count)
    return LiveUpstream(f"{warehouse}/orders", spec, random.Random(seed), simple_row,
                        lambda rng: rng.randint(1, 10_000))


@pytest.mark.parametrize("mode", MODES)
def test_many_barriers_with_live_dml(spark, warehouse, mode):
    live = _live(warehouse, 8, seed=1)
    live.create(rows=120)
    d = simple_mv(8, mode=mode, chunk_size=6)
    tables = MVTables.under(warehouse, d.name, "orders")
    stats = drive(spark, d, tables, live, ranges=[range(8)], changes_per_barrier=6)
    assert stats["barriers"] >= 4 and stats["forwarded_rows"] > 0
