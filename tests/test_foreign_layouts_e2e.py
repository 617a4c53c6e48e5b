"""Backfills over upstreams the platform did not write, checked against the oracle.

- a Databricks-written table with a live deletion vector (its deleted rows must never reach
  the MV), then DML by another engine;
- a Databricks-written table with column mapping (name mode: parquet columns are UUIDs);
- a table partitioned by a string column with non-ASCII values (values from the log, never
  from folder names);
- an MV built over another MV of the platform (a merge-on-read table with DVs and change files).
Every check also reads the MV with QueryBuilder, polars and the Spark reader and replays its
change feed (tests/support.py, assert_verified).
"""

from __future__ import annotations

import os
import random
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from tests.support import LiveUpstream, assert_verified, drive, simple_mv, simple_row, simple_spec

KERNEL = os.path.join(os.path.dirname(__file__), "data", "kernel")
VNODES = 8
pytestmark = [pytest.mark.spark]


def _mv(name: str, uri: str, pk: str, columns: list[str], **extra) -> MVDefinition:
    return MVDefinition.from_dict({"name": name, "upstream": uri, "primary_key": [pk],
                                   "columns": columns, "chunk_size": 3,
                                   "vnode_count": VNODES, **extra})


def _until_finished(spark, d, tables, dml=None, limit: int = 40) -> None:
    for n in range(limit):
        if dml:
            dml(n)
        reports = [run_barrier(spark, d, tables, list(range(VNODES)))]
        assert_verified(spark, d, tables)
        if all(r.finished for r in reports) and n > 2:
            return
    raise AssertionError("the backfill did not finish")


def test_databricks_table_with_a_deletion_vector(spark, warehouse):
    uri = f"{warehouse}/dv_upstream"
    shutil.copytree(os.path.join(KERNEL, "table-with-dv-small"), uri)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    assert sorted(pa.table(DeltaTable(uri).scan())["value"].to_pylist()) == list(range(1, 9))
    d = _mv("dv_mv", uri, "value", ["value"])
    tables = MVTables.under(warehouse, d.name, uri)
    rng = random.Random(3)

    def dml(n: int) -> None:
        if n % 2:
            DeltaTable(uri).delete(f"value = {rng.randint(1, 8)}")
        else:
            write_deltalake(uri, pa.table({"value": pa.array([100 + n], pa.int32())}),
                            mode="append")

    _until_finished(spark, d, tables, dml)
    mv_values = set(pa.table(DeltaTable(tables.mv).scan())["value"].to_pylist())
    assert not mv_values & {0, 9}, "rows deleted by the upstream's DV reached the MV"


def test_databricks_table_with_column_mapping(spark, warehouse):
    uri = f"{warehouse}/cm_upstream"
    shutil.copytree(os.path.join(KERNEL, "cdf-column-mapping-name-mode"), uri)
    d = _mv("cm_mv", uri, "id", ["id", "name", "value"])
    tables = MVTables.under(warehouse, d.name, uri)
    _until_finished(spark, d, tables)
    rows = sorted(pa.table(DeltaTable(tables.mv).scan()).select(["id", "name"]).to_pylist(),
                  key=lambda r: r["id"])
    assert rows == [{"id": 2, "name": "Bob"}, {"id": 3, "name": "Charlie"},
                    {"id": 4, "name": "David"}]


def test_non_ascii_partition_values_come_from_the_log(spark, warehouse):
    uri = f"{warehouse}/países"
    # ("a b/c=d" is left out: delta-rs 1.6.6 load_cdf double-encodes such cdc folder names)
    countries = ["España", "日本", "Ελλάδα", "Zürich"]
    schema = pa.schema([("country", pa.string()), ("id", pa.int64()), ("qty", pa.int32())])
    rng = random.Random(8)
    rows = [{"country": rng.choice(countries), "id": i, "qty": rng.randint(0, 9)}
            for i in range(60)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema), partition_by=["country"],
                    configuration={"delta.enableChangeDataFeed": "true"})
    d = _mv("geo_mv", uri, "id", ["id", "country", "qty"])
    tables = MVTables.under(warehouse, d.name, uri)

    def dml(n: int) -> None:
        fresh = [{"country": rng.choice(countries), "id": 100 + n, "qty": n % 10}]
        write_deltalake(uri, pa.Table.from_pylist(fresh, schema), mode="append")
        DeltaTable(uri).delete(f"id = {rng.randint(0, 59)}")

    _until_finished(spark, d, tables, dml)
    got = set(pa.table(DeltaTable(tables.mv).scan())["country"].to_pylist())
    assert got <= set(countries) and len(got) > 1


@pytest.mark.slow
def test_an_mv_over_an_mv(spark, warehouse):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(12),
                        simple_row, lambda r: r.randint(1, 10_000))
    live.create(rows=80)
    first = simple_mv(VNODES, chunk_size=6)
    first_tables = MVTables.under(warehouse, first.name, "orders")
    second = MVDefinition.from_dict({
        "name": "mv_on_mv", "upstream": first_tables.mv, "primary_key": ["id"],
        "columns": ["id", "name_upper", "amount_x_qty"], "filter": "amount_x_qty > 10",
        "chunk_size": 4, "vnode_count": VNODES})
    second_tables = MVTables.under(warehouse, second.name, first_tables.mv)

    def both(n: int) -> None:
        run_barrier(spark, second, second_tables, list(range(VNODES)))
        assert_verified(spark, second, second_tables)

    drive(spark, first, first_tables, live, ranges=[range(VNODES)], changes_per_barrier=6,
          between=lambda n: both(n) if n else None)
    _until_finished(spark, second, second_tables)
