"""An MV with joins is refused by name at its first barrier and writes nothing, until a step
serves joins (docs/JOINS.md). Real Spark, real Delta tables in a temporary warehouse."""

from __future__ import annotations

import pytest

from backfill_assets.core import errors
from tests.reliability import harness as H
from tests.test_bad_input import refused
from tests.test_refusals_write_nothing import _no_state_left

pytestmark = pytest.mark.spark


def test_an_mv_with_joins_is_refused_by_name_until_barriers_serve_it(spark, warehouse):
    live = H.orders(warehouse, 35)
    live.create(rows=40)
    raw = H.mv_raw("joined_new", "snapshot", 5, live.uri)
    raw["joins"] = [{"table": "customers", "key": ["cid"], "on": {"id": "cid"},
                     "columns": ["region"], "kind": "left"}]
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    refused(spark, d, tables, errors.JoinMVNotServed, r"no barrier runs them yet")
    _no_state_left(tables)
