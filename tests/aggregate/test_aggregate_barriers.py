"""Aggregate MVs run as barriers: after every barrier the MV equals Spark's GROUP BY of the
upstream at the barrier's version (verify/aggregate_oracle.py), values and types, under
random DML from the platform's writer (group moves, deletes of the current min/max, nulls,
decimals, filter crossings), on the driver path and the recompute path; every reader
(delta-rs, DataFusion, polars, Delta-Spark) sees the MV, and its change feed replays into it."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable

from backfill_assets.aggregate.store import GROUP_KEY
from backfill_assets.barrier.follower import follow
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.mv.controls import Controls
from backfill_assets.upstream.writer import DmlBatch
from backfill_assets.verify.aggregate_oracle import verify_aggregate
from tests.reliability import harness as H
from tests.support import assert_mv_readers_and_feed, assert_verified, caught_up, wait_for

AGGREGATES = {"revenue": "sum(amount)", "orders": "count(*)", "avg_amount": "avg(amount)",
              "qty_sum": "sum(qty)", "avg_qty": "avg(qty)", "biggest": "max(amount)",
              "smallest": "min(amount)", "first_name": "min(name)", "names": "count(DISTINCT name)",
              "gross": "sum(gross)", "top_gross": "max(gross)", "n_amount": "count(amount)"}


def aggregate_raw(name: str, upstream: str, vnode_count: int = 8, **extra) -> dict:
    """Revenue per name and month, over rows with qty > 2 (a filter rows cross)."""
    return {"name": name, "upstream": upstream, "primary_key": ["id"], "filter": "qty > 2",
            "computed": [{"name": "gross", "expr": "amount * qty"}],
            "group_by": ["name", {"name": "month", "expr": "trunc(day, 'MM')"}],
            "aggregates": dict(AGGREGATES), "vnode_count": vnode_count, **extra}


def extremes_batch(live, rng: random.Random, tops: list[int]) -> DmlBatch:
    """Random DML, plus updates that null a row's name and amount or make it its group's
    maximum (999.99), and deletes of the maxima the previous batch made (a group's current
    max retracted: the next one must come from the kept input)."""
    batch = live.random_batch(12)
    picked = {r["id"] for r in batch.updates} | {r["id"] for r in batch.inserts}
    picked |= {k[0] for k in batch.deletes} | {k[0] for k, _ in batch.pk_changes}
    picked |= {r["id"] for _, r in batch.pk_changes}
    doomed = [k for k in tops if k in live.keys and k not in picked]
    batch.deletes.extend((k,) for k in doomed)
    live.keys.difference_update(doomed)
    picked |= set(doomed)
    free = sorted(k for k in live.keys if k not in picked)
    rng.shuffle(free)
    tops.clear()
    for key in free[:4]:
        row = live.make_row(rng, key)
        if rng.random() < 0.5:
            row.update(name=None, amount=None)
        else:
            row.update(amount=Decimal("999.99"), qty=5)
            tops.append(key)
        batch.updates.append(row)
    return batch


def assert_exact(spark, d, tables) -> int:
    """Spark's GROUP BY equals the MV; delta-rs, DataFusion, polars and the Spark reader read
    the same rows; the MV's change feed since the last check replays into them."""
    verdict = verify_aggregate(spark, d, tables)
    assert not verdict.type_problems, verdict.type_problems
    assert verdict.ok, [v for v in verdict.failures()][:4]
    assert_mv_readers_and_feed(spark, tables.mv, [GROUP_KEY])
    return verdict.rows_compared


def test_aggregate_mv_equals_spark_group_by_after_every_barrier(spark, warehouse):
    rng = random.Random(49)
    live = H.orders(warehouse, 49)
    live.create(rows=300)
    raw = aggregate_raw("agg_orders", live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    first = run_barrier(spark, d, tables, [0, 1])
    assert first.finished and first.extra["aggregate_path"] == "bulk"
    assert first.snapshot_rows == 300
    groups = assert_exact(spark, d, tables)
    assert groups > 20
    paths, tops = set(), []
    for n in range(6):
        live.apply(extremes_batch(live, rng, tops))
        if n == 3:
            live.apply(live.random_batch(10))  # two versions in one barrier
        report = run_barrier(spark, d, tables, list(range(8)))
        paths.add(report.extra["aggregate_path"])
        assert report.finished and report.v_new == H.latest(live.uri)
        assert_exact(spark, d, tables)
    assert paths == {"apply"}
    # the last group of a name deleted: its groups disappear
    live.delete_where(lambda k: k % 3 == 0)
    forced = run_barrier(spark, d, tables, [0], overrides=Controls(barrier_choice="resnapshot"))
    assert forced.extra["aggregate_path"] == "recompute"
    assert_exact(spark, d, tables)
    idle = run_barrier(spark, d, tables, [0])
    assert idle.v_new == forced.v_new
    assert_exact(spark, d, tables)


def test_delta_spark_reads_the_aggregate_mv_and_its_change_feed(spark, warehouse):
    live = H.orders(warehouse, 50)
    live.create(rows=60)
    raw = aggregate_raw("agg_read", live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    live.apply(live.random_batch(8))
    report = run_barrier(spark, d, tables, [0])
    mv = spark.read.format("delta").load(tables.mv)
    assert mv.count() == report.extra["groups_written"] or mv.count() > 0
    assert {"name", "month", "revenue", "orders", "vnode"} <= set(mv.columns)
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", 0).load(tables.mv))
    kinds = {r["_change_type"] for r in feed.select("_change_type").distinct().collect()}
    assert "insert" in kinds and kinds <= {"insert", "update_preimage", "update_postimage",
                                           "delete"}


def test_continuous_mode_follows_an_aggregate_mv(spark, warehouse):
    """The follower (barrier/follower.py) runs an aggregate MV's barriers through the same
    door while the upstream keeps changing; once it has caught up, the MV is exact."""
    live = H.orders(warehouse, 52)
    live.create(rows=80)
    raw = aggregate_raw("agg_follow", live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    stop, records = threading.Event(), []
    follower = threading.Thread(target=follow, args=(spark, d, tables, list(range(8))),
                                kwargs={"on_barrier": records.append, "stop": stop,
                                        "poll_seconds": 0.2, "log": lambda _: None})
    follower.start()
    try:
        for _ in range(4):
            live.apply(live.random_batch(6))
            time.sleep(0.3)
        version = H.latest(live.uri)
        wait_for("the follower to catch up", lambda: caught_up(tables, version, 8), 180)
    finally:
        stop.set()
        follower.join(60)
    assert len(records) >= 2
    assert_exact(spark, d, tables)


def test_a_resnapshot_recomputes_every_group_at_the_same_version(spark, warehouse):
    """resnapshot_job's path (barrier/resnapshot.py) for an aggregate MV: every table
    recomputed at the upstream's version; the MV's feed holds only real differences (none)."""
    from backfill_assets.barrier.resnapshot import resnapshot

    live = H.orders(warehouse, 53)
    live.create(rows=50)
    raw = aggregate_raw("agg_resnap", live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
    before = H.latest(tables.mv)
    report = resnapshot(spark, d, tables, [0, 1])
    assert report.extra["aggregate_path"] == "recompute" and "recomputed" in \
        report.extra["resnapshot"]
    feed = DeltaTable(tables.mv).load_cdf(starting_version=before + 1) \
        if H.latest(tables.mv) > before else None
    assert feed is None or pa.table(feed).num_rows == 0  # nothing differed
    assert_exact(spark, d, tables)


def test_a_row_mv_over_an_aggregate_mv(spark, warehouse):
    """The aggregate MV is an upstream like any Delta table with a change feed: a row MV over
    it (keyed by the group columns, filtered on an aggregate) stays exact as both advance."""
    live = H.orders(warehouse, 54)
    live.create(rows=150)
    raw = aggregate_raw("agg_under", live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    top_raw = {"name": "busy_months", "upstream": tables.mv, "primary_key": ["name", "month"],
               "columns": ["name", "month", "revenue", "orders"], "filter": "orders > 1",
               "vnode_count": 4}
    top, top_tables = H.definition(top_raw), H.tables_of(warehouse, top_raw)
    for _ in range(3):
        live.apply(live.random_batch(10))  # names are never null here: a key of the row MV
        run_barrier(spark, d, tables, [0])
        assert_exact(spark, d, tables)
        run_barrier(spark, top, top_tables, list(range(4)))
        assert_verified(spark, top, top_tables)
