"""A Delta-Spark MERGE writer (a streaming upsert job's micro-batches: updates, inserts and
deletes in one MERGE, with deletion vectors and the change feed) as the live upstream of an
aggregate MV: after every barrier the MV equals Spark's GROUP BY at the barrier's version."""

from __future__ import annotations

import pytest

from backfill_assets.barrier.runner import run_barrier
from tests.aggregate.test_aggregate_barriers import aggregate_raw, assert_exact
from tests.interop.test_delta_spark_writer_e2e import merge_writer, micro_batch
from tests.reliability import harness as H

pytestmark = pytest.mark.spark


def test_an_aggregate_mv_over_a_delta_spark_merge_writer(spark, warehouse):
    up = merge_writer(spark, warehouse, seed=49, rows=150)
    raw = aggregate_raw("merged_agg", up.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    assert_exact(spark, d, tables)
    for n in range(4):
        for _ in range(1 + n % 2):  # some barriers span two MERGEs
            micro_batch(up)
        report = run_barrier(spark, d, tables, [0])
        assert report.v_new == up.version and report.extra["aggregate_path"] == "apply"
        assert_exact(spark, d, tables)
    assert up.wrote_dvs(), "the MERGEs wrote no deletion vector"
