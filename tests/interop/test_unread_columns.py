"""Upstream columns the MV does not read, on tables Delta-Spark writes and alters.

- Nested columns (struct, array, map) beside the MV's scalar ones: the MV is built and kept
  current through UPDATEs of the nested values, DELETEs (deletion vectors) and MERGEs; an MV
  that selects a nested column is refused by name and leaves nothing, not even its folder.
- RENAME COLUMN and DROP COLUMN (column mapping) of columns the MV does not read, between
  barriers and around a barrier process SIGKILLed between its MV and progress commits
  (tests/reliability's light child): the MV goes on,
  exact against Delta-Spark's own recompute (tests/interop/delta_spark.py) after every
  barrier, in snapshot and arrangement mode. (no_shuffle reads upstreams the platform
  arranged, whose columns users do not rename.) A read column renamed is refused by name,
  and the MV's tables stay as they were.
"""

from __future__ import annotations

import glob
import os

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core import errors
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from tests.interop.delta_spark import assert_mv_as_delta_spark_reads
from tests.reliability import harness as H

pytestmark = pytest.mark.spark
VNODES = 4
ALL = list(range(VNODES))
COLUMNS = ("id BIGINT, qty INT, label STRING, s STRUCT<a: INT, `b c`: STRING>, "
           "tags ARRAY<STRING>, attrs MAP<STRING, STRUCT<x: DOUBLE>>, note STRING")


def _row(i: int) -> str:
    return (f"({i}, {i % 9}, 'l{i}', named_struct('a', {i}, 'b c', 's{i}'), "
            f"array('t{i}', NULL), map('k{i}', named_struct('x', {i}.5D)), 'n{i}')")


def _upstream(spark, uri: str, rows: int = 60) -> None:
    spark.sql(f"CREATE TABLE delta.`{uri}` ({COLUMNS}) USING delta TBLPROPERTIES ("
              "'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true', "
              "'delta.columnMapping.mode' = 'name')")
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES {', '.join(_row(i) for i in range(rows))}")


def _raw(uri: str, mode: str, columns=("id", "qty"), name: str = "narrow") -> dict:
    return {"name": name, "upstream": uri, "primary_key": ["id"], "columns": list(columns),
            "filter": "qty > 0", "computed": [{"name": "twice", "expr": "qty * 2"}],
            "chunk_size": 7, "vnode_count": VNODES, "mode": mode}


def _mv(uri: str, warehouse: str, mode: str, columns=("id", "qty"), name: str = "narrow"):
    raw = _raw(uri, mode, columns, name)
    return MVDefinition.from_dict(raw), MVTables.under(warehouse, name, uri)


def _barrier(spark, d, tables, **kw) -> None:
    run_barrier(spark, d, tables, ALL, **kw)
    assert_mv_as_delta_spark_reads(spark, d, tables)


@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_unread_nested_renamed_and_dropped_columns(spark, warehouse, mode):
    uri = f"{warehouse}/nested"
    _upstream(spark, uri)
    d, tables = _mv(uri, warehouse, mode)
    _barrier(spark, d, tables)
    spark.sql(f"UPDATE delta.`{uri}` SET s = named_struct('a', -1, 'b c', 'u'), "
              "tags = array('u') WHERE id % 4 = 0")
    spark.sql(f"UPDATE delta.`{uri}` SET qty = qty + 10 WHERE id % 5 = 0")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 7 = 3")
    _barrier(spark, d, tables)
    spark.sql(f"ALTER TABLE delta.`{uri}` RENAME COLUMN label TO label_2")
    spark.sql(f"ALTER TABLE delta.`{uri}` DROP COLUMN s")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING (SELECT id, qty FROM delta.`{uri}` "
              "WHERE id % 6 = 1 UNION ALL SELECT 100 + id, 3 FROM range(5)) c "
              "ON t.id = c.id WHEN MATCHED THEN UPDATE SET t.qty = c.qty + 1, t.tags = NULL "
              "WHEN NOT MATCHED THEN INSERT (id, qty, note) VALUES (c.id, c.qty, 'new')")
    # a child process running the barrier is SIGKILLed between its MV and progress commits
    child = H.light_backfill(H.light_args(warehouse, _raw(uri, mode), None, ALL,
                                          kill_at="after_mv_commit"))
    assert child.killed, child.output[-3000:]
    spark.sql(f"ALTER TABLE delta.`{uri}` DROP COLUMNS (tags, attrs)")
    spark.sql(f"ALTER TABLE delta.`{uri}` RENAME COLUMN note TO remark")
    spark.sql(f"UPDATE delta.`{uri}` SET qty = 0 WHERE id % 8 = 2")
    for _ in range(6):
        _barrier(spark, d, tables)
    assert H.table_versions(tables)["progress"] is not None
    spark.sql(f"ALTER TABLE delta.`{uri}` RENAME COLUMN qty TO quantity")
    before = H.table_versions(tables)
    with pytest.raises(errors.UpstreamSchemaChanged,
                       match="renamed column 'qty' to 'quantity', which MV 'narrow' reads"):
        run_barrier(spark, d, tables, ALL)
    assert H.table_versions(tables) == before


@pytest.mark.parametrize("read", ["s", "tags", "attrs"])
def test_an_mv_that_selects_a_nested_column_is_refused_and_leaves_nothing(spark, warehouse,
                                                                          read):
    uri = f"{warehouse}/nested"
    _upstream(spark, uri, rows=5)
    d, tables = _mv(uri, warehouse, "snapshot", ("id", "qty", read), name="wide")
    with pytest.raises(errors.UnsupportedColumnType,
                       match=f"MV 'wide' reads column '{read}' of type .*leave it out"):
        run_barrier(spark, d, tables, ALL)
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}
    assert not os.path.exists(tables.root), glob.glob(f"{tables.root}/**", recursive=True)


def test_no_shuffle_goes_on_when_unread_columns_are_renamed_and_dropped(spark, warehouse):
    """no_shuffle reads an upstream the platform arranged (its own vnode-partitioned table);
    a user turns column mapping on with Delta-Spark, renames and drops the column the MV does
    not read, and writes on: the MV goes on, the oracle green after every barrier."""
    live = H.orders(warehouse, 52)
    live.create(rows=120)
    raw = H.mv_raw("ns", "no_shuffle", 6, live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    vnodes = list(range(H.VNODES))
    run_barrier(spark, d, tables, vnodes)
    uri = live.uri
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.columnMapping.mode' = "
              "'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    spark.sql(f"ALTER TABLE delta.`{uri}` RENAME COLUMN day TO day_2")
    run_barrier(spark, d, tables, vnodes)
    H.assert_oracle(spark, d, tables, "after a rename of an unread column")
    spark.sql(f"ALTER TABLE delta.`{uri}` DROP COLUMN day_2")
    spark.sql(f"UPDATE delta.`{uri}` SET qty = qty + 1 WHERE id % 3 = 0")
    for _ in range(40):
        report = run_barrier(spark, d, tables, vnodes)
        H.assert_oracle(spark, d, tables, "after a drop of an unread column")
        if report.finished:
            break
    assert report.finished
