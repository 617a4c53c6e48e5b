"""A barrier that needs no Spark work starts no JVM.

A catch-up small enough for the driver engine, in a process of its own (as `dagster job
execute` runs each barrier), takes the MV schema from the progress table's pin instead of a
Spark analysis and never starts the session: the child reports whether it did. The MV is
checked against the oracle after each child, and a changed definition is still refused.
"""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from backfill_assets.engine.projection import _validate
from backfill_assets.step.preflight import checked_upstream
from tests.reliability import harness as H


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_driver_barriers_in_a_new_process_start_no_jvm(spark, tmp_path, mode):
    warehouse = str(tmp_path / "warehouse")
    live = H.orders(warehouse, seed=41)
    versions = H.prewrite(live, rows=200, batches=3, changes=10)
    raw = H.mv_raw(f"lazy_{mode}", mode, 8, live.uri)
    chain = H.Chain(spark, warehouse, raw)
    while not chain.run(H.Barrier(versions[0])).finished:  # the snapshot, in this process
        pass
    d, tables = chain.d, chain.tables
    pin = json.loads(DeltaTable(tables.progress).metadata().description)
    upstream = checked_upstream(tables, d, versions[0])
    assert "mv_schema" in pin and upstream.mv_schema == _validate(spark, d, upstream.schema)

    for version in versions[1:]:
        child = H.light_backfill(H.light_args(warehouse, raw, version, range(H.VNODES)))
        res = child.result
        assert res and res["error"] is None, child.output[-3000:]
        assert res["forwarded_rows"] > 0 and res["engine"] == "driver"
        assert res["spark_started"] is False, "a driver barrier started Spark"
        H.assert_oracle(spark, d, tables, f"{mode} catch-up to v{version} in a child")

    changed = {**raw, "filter": "qty > 3"}  # refused by the pin, before any Spark work
    child = H.light_backfill(H.light_args(warehouse, changed, None, range(H.VNODES)))
    assert child.error == "MVDefinitionChanged", child.output[-3000:]
