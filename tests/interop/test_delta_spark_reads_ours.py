"""Our tables, read by the reference reader. After every barrier of a live scenario (bulk
slices, catch-up, small driver barriers with DVs, chunked steps) and after our maintenance
(compaction, DV garbage collection, vacuum, a checkpoint): Delta-Spark's read of the MV, the
replica and the progress table at every new version equals delta-rs' read, the MV equals the
oracle (tests.support.assert_verified), the MV's change feed read by Delta-Spark replays into
it, and DESCRIBE HISTORY / DETAIL work. Then Delta-Spark's own maintenance on our MV
(OPTIMIZE, REORG ... APPLY (PURGE), VACUUM at the default retention) leaves the next barriers
exact.
"""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.storage import maintain
from tests.interop.delta_spark import (
    assert_feed_replays,
    assert_history_and_detail,
    assert_versions_read_alike,
)
from tests.support import LiveUpstream, assert_verified, simple_mv, simple_row, simple_spec

VNODES = 8


def _live(warehouse: str) -> LiveUpstream:
    return LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(37),
                        simple_row, lambda rng: rng.randint(1, 10_000))


def _exists(uri: str) -> bool:
    return DeltaTable.is_deltatable(uri)


@pytest.mark.spark
@pytest.mark.parametrize("mode", [
    "snapshot", pytest.param("arrangement", marks=pytest.mark.variant)])  # CI time
def test_every_version_of_our_tables_reads_right_in_delta_spark(spark, warehouse, mode):
    live = _live(warehouse)
    live.create(rows=120)
    extra = {"slice_rows": 40} if mode == "snapshot" else {}
    d = simple_mv(VNODES, mode=mode, chunk_size=12, **extra)
    tables = MVTables.under(warehouse, d.name, "orders")
    checked: dict[str, int] = {}
    finished = 0
    for _ in range(30):
        live.apply(live.random_batch(6))
        report = run_barrier(spark, d, tables, range(VNODES))
        assert_verified(spark, d, tables)
        _check_new_versions(spark, tables, checked)
        finished += report.finished
        if finished >= 3:
            break
    assert finished >= 3, "the backfill did not finish"
    assert checked[tables.mv] >= 3

    # our maintenance (compaction, DV garbage collection, vacuum, checkpoint: maintain_job),
    # read by Delta-Spark; versions before it are vacuumed, so the feed restarts after it
    for uri in (tables.mv, tables.replica):
        if _exists(uri):
            maintain(spark, uri, ["id"], retention_hours=0, dv_keep_versions=1,
                     dv_min_age_seconds=0)
    checked = {uri: v for uri, v in checked.items() if uri == tables.progress}
    _check_new_versions(spark, tables, checked, feed_from_first=False)
    assert_verified(spark, d, tables)

    # Delta-Spark's maintenance on our MV, then more barriers: exact
    for sql in (f"OPTIMIZE delta.`{tables.mv}`",
                f"REORG TABLE delta.`{tables.mv}` APPLY (PURGE)",
                f"VACUUM delta.`{tables.mv}`"):
        spark.sql(sql).collect()
        live.apply(live.random_batch(6))
        run_barrier(spark, d, tables, range(VNODES))
        assert_verified(spark, d, tables)
        _check_new_versions(spark, tables, checked)
    assert_history_and_detail(spark, tables.mv)


def _check_new_versions(spark, tables: MVTables, checked: dict[str, int],
                        feed_from_first: bool = True) -> None:
    for uri, feed in ((tables.mv, True), (tables.replica, False), (tables.progress, False)):
        if not _exists(uri):
            continue
        latest = DeltaTable(uri).version()
        first = checked.get(uri, -1) + 1
        if not feed_from_first and uri not in checked:  # after a vacuum: the latest only
            first = latest
        if first > latest:
            continue
        assert_versions_read_alike(spark, uri, first, latest)
        if feed and uri in checked:  # the MV's feed since the version checked last
            assert_feed_replays(spark, uri, ["id"], first - 1, latest)
        checked[uri] = latest
