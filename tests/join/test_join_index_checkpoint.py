"""The index between checkpoints (join/index_checkpoint.py): barriers in one process leave
the index table behind the progress (its changes held in memory) until a checkpoint is due,
a dimension whose version did not move is not committed, and a process that lost what it
held (a new process; a crash inside a barrier that skipped the index's commit) replays the
fact feed since the checkpoint and lands the MV exactly on Spark's join."""

from __future__ import annotations

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.join import index_checkpoint
from backfill_assets.join.store import PROGRESS, pair_of, recorded_pair
from backfill_assets.mv.owned_tables import open_if_exists
from backfill_assets.storage import TableVersion
from tests.join.test_join_barriers import assert_exact, left_join_mv

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class _Killed(Exception):
    pass


def _pair(tables, name: str, phase: str, uri: str):
    table = open_if_exists(uri, {})
    return pair_of(TableVersion(uri, {}, table).txn_versions, name, phase, range(8), 1)


def _forget_all() -> None:
    """What a new process holds: nothing."""
    index_checkpoint._LAGS.discard_where(lambda _: True)


def test_the_index_lags_between_checkpoints_and_a_lost_process_replays(spark, warehouse,
                                                                        monkeypatch):
    monkeypatch.setattr(index_checkpoint, "CHECKPOINT_BARRIERS", 3)
    name = "joined_lag"
    live, dim, d, tables = left_join_mv(spark, warehouse, 61, name, 120, 14)
    index_uri, dim_uri = f"{tables.join_state}/index_0", f"{tables.join_state}/dimension_0"
    assert run_barrier(spark, d, tables, [0]).extra["join_path"] == "bulk"
    checkpoints = []
    for n in range(7):
        live.apply(live.random_batch(10))
        if n % 3 == 1:
            dim.random_dml()
        dims_before = _pair(tables, name, "join_dimension_0", dim_uri)
        report = run_barrier(spark, d, tables, [0])
        checkpoints.append(report.extra["index_checkpoint"])
        assert_exact(spark, d, tables)
        index = _pair(tables, name, "join_index_0", index_uri)
        at = recorded_pair(name, tables, 1, 8)
        assert (index == at) == report.extra["index_checkpoint"]
        assert index.fact <= at.fact
        if n % 3 != 1:  # the dimension did not move: its table was not committed
            assert _pair(tables, name, "join_dimension_0", dim_uri) == dims_before
    # the bulk's commit is a checkpoint: the third barrier after it commits, and so on
    assert checkpoints == [False, False, True, False, False, True, False]
    assert "index_replayed" not in report.extra

    _forget_all()  # a new process: the fact feed since the checkpoint is replayed
    live.apply(live.random_batch(10))
    report = run_barrier(spark, d, tables, [0])
    assert report.extra["index_replayed"] and report.extra["index_checkpoint"]
    assert_exact(spark, d, tables)

    for _ in range(1):  # a crash after the MV's commit in a barrier that skipped the index's
        live.apply(live.random_batch(10))
        run_barrier(spark, d, tables, [0])
    live.apply(live.random_batch(10))
    dim.random_dml()

    def kill(point: str) -> None:
        if point == "after_mv_commit":
            raise _Killed(point)

    with pytest.raises(_Killed):
        run_barrier(spark, d, tables, [0], hook=kill)
    index, at = _pair(tables, name, "join_index_0", index_uri), recorded_pair(name, tables, 1, 8)
    assert index.fact < at.fact < _pair(tables, name, "mv", tables.mv).fact
    _forget_all()
    report = run_barrier(spark, d, tables, [0])
    assert report.recovered and report.extra["index_replayed"]
    assert _pair(tables, name, PROGRESS, tables.progress) is not None
    assert_exact(spark, d, tables)
    live.apply(live.random_batch(10))
    dim.random_dml()
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
