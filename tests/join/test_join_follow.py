"""Continuous mode for a join MV: the follower (`barrier.follower.follow`, what follower_job
runs) waits on the fact and on the dimension (`barrier.runner.watched_uris`), so a commit on
either side, a Delta-Spark write to the dimension alone included, reaches the MV, which then
equals Spark SQL's join at its recorded pair."""

from __future__ import annotations

import threading
import time

import pytest

from backfill_assets.barrier.follower import follow
from backfill_assets.barrier.runner import watched_uris
from tests.join.test_join_barriers import assert_exact, left_join_mv
from tests.reliability import harness as H

pytestmark = pytest.mark.spark


def _until(records: list, fact: int, dim: int, timeout: float = 90.0) -> None:
    """Until a barrier brought the MV to (at least) the pair (fact, dim)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records and records[-1].report.v_new >= fact and \
                records[-1].report.extra["dimension_versions"][0] >= dim:
            return
        time.sleep(0.2)
    raise AssertionError(f"no barrier reached ({fact}, {dim}): {[r.report for r in records]}")


def test_a_commit_on_either_side_wakes_the_follower(spark, warehouse):
    live, dim, d, tables = left_join_mv(spark, warehouse, 70, "joined_follow", rows=60, keys=12)
    assert watched_uris(d, tables) == (live.uri, dim.uri)
    records, stop = [], threading.Event()
    thread = threading.Thread(target=follow, args=(spark, d, tables, list(range(8))),
                              kwargs={"on_barrier": records.append, "stop": stop,
                                      "poll_seconds": 0.5, "log": print}, daemon=True)
    thread.start()
    try:
        _until(records, H.latest(live.uri), H.latest(dim.uri))
        for _ in range(2):
            dim.random_dml()  # the dimension alone: the fact's log does not move
            _until(records, H.latest(live.uri), H.latest(dim.uri))
            assert_exact(spark, d, tables)
            live.apply(live.random_batch(6))
            _until(records, H.latest(live.uri), H.latest(dim.uri))
            assert_exact(spark, d, tables)
        settled = len(records)
        time.sleep(2.0)  # idle: no barrier without a commit
        assert len(records) == settled
    finally:
        stop.set()
        thread.join(timeout=120)
