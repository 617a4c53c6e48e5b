"""A join MV whose dimension cannot serve it is refused by name at its first barrier and
writes nothing: a dimension that does not exist, one without a change data feed (read by
Delta-Spark's own CREATE TABLE). A row MV's step, reached directly, still refuses an MV with
joins (it would ignore them). Real Spark, real Delta tables in a temporary warehouse."""

from __future__ import annotations

import pytest

from backfill_assets.core import errors
from backfill_assets.step.preflight import checked_upstream
from tests.reliability import harness as H
from tests.test_bad_input import refused
from tests.test_refusals_write_nothing import _no_state_left

pytestmark = pytest.mark.spark


def _raw(live) -> dict:
    raw = H.mv_raw("joined_new", "snapshot", 5, live.uri)
    raw["joins"] = [{"table": "customers", "key": ["cid"], "on": {"id": "cid"},
                     "columns": ["region"], "kind": "left"}]
    return raw


def test_a_join_whose_dimension_cannot_serve_is_refused_by_name(spark, warehouse):
    live = H.orders(warehouse, 35)
    live.create(rows=40)
    raw = _raw(live)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    refused(spark, d, tables, errors.UpstreamNotFound, r"dimension 'customers'")
    _no_state_left(tables)
    spark.sql(f"CREATE TABLE delta.`{warehouse}/customers` (cid BIGINT, region STRING) "
              "USING delta")
    refused(spark, d, tables, errors.DimensionWithoutChangeFeed, r"no change data feed")
    _no_state_left(tables)
    with pytest.raises(errors.JoinMVNotServed, match="would ignore its joins"):
        checked_upstream(tables, d, None)
