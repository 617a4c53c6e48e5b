"""What an aggregate barrier took off its serial path (docs/AGGREGATES.md, "The barrier's
serial path"): the progress commit finished by a background thread (mv/commit_later.py),
which every later open of the progress table in the process waits for."""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.progress import Completed
from backfill_assets.mv import owned_tables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.preflight import checked_upstream
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact, extremes_batch
from tests.reliability import harness as H


def _progress_at(d, tables) -> set[int]:
    """The versions the progress table records (opened as every reader opens it)."""
    table = owned_tables.open_if_exists(tables.progress, tables.storage_options)
    key_order = checked_upstream(tables, d, None).key_order
    rows = read_progress(table, key_order, range(d.vnode_count))
    assert all(isinstance(p, Completed) for p, _ in rows.values())
    return {v for _, v in rows.values()}


def _built(spark, warehouse, seed: int, name: str, rows: int):
    """(random source, the live upstream, definition, tables, the bulk barrier's report)."""
    live = H.orders(warehouse, seed)
    live.create(rows=rows)
    raw = aggregate_raw(name, live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    return random.Random(seed), live, d, tables, run_barrier(spark, d, tables, [0])


def test_the_progress_lands_before_any_reader_sees_it(spark, warehouse):
    rng, live, d, tables, _ = _built(spark, warehouse, 4911, "agg_serial", 200)
    tops: list[int] = []
    for _ in range(3):
        live.apply(extremes_batch(live, rng, tops))
        report = run_barrier(spark, d, tables, [0])
        assert _progress_at(d, tables) == {report.v_new}
        assert_exact(spark, d, tables)


def test_a_failed_background_progress_commit_surfaces_and_the_next_barrier_completes_it(
        spark, warehouse):
    rng, live, d, tables, first = _built(spark, warehouse, 4912, "agg_serial_fail", 120)
    live.apply(extremes_batch(live, rng, []))

    def failing(point: str) -> None:
        if point == "before_progress_commit":
            raise OSError("the store went away")

    done = run_barrier(spark, d, tables, [0], hook=failing)  # the MV holds the barrier
    with pytest.raises(OSError, match="went away"):  # the next open of the progress says so
        owned_tables.open_if_exists(tables.progress, tables.storage_options)
    assert _progress_at(d, tables) == {first.v_new}
    report = run_barrier(spark, d, tables, [0])
    assert report.v_new == done.v_new and report.recovered
    assert _progress_at(d, tables) == {done.v_new}
    assert_exact(spark, d, tables)
