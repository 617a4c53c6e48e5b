"""A refused first barrier writes nothing: no MV, replica or progress table, no run layout, not
even an empty table (the upstream's protocol is checked on its log head before any table is
created, and mv/reset.py's nothing_left_on_refusal deletes what a refused barrier created).
Real Spark, real Delta tables in a temporary warehouse."""

from __future__ import annotations

import glob
import os

import pytest
from deltalake import write_deltalake

from backfill_assets.core import errors
from backfill_assets.mv.owned_tables import MVTables
from tests.reliability import harness as H
from tests.test_bad_input import FOREIGN, _duplicate, _foreign, _foreign_mv, _foreign_rows, refused

pytestmark = pytest.mark.spark


# ------------------------------------------------------- a refused first barrier writes nothing


def _no_state_left(tables: MVTables) -> None:
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}
    assert not glob.glob(os.path.join(os.path.dirname(tables.mv), "*")), \
        "a refused first barrier left files beside the MV's tables"
    assert not os.path.exists(os.path.dirname(tables.mv)), \
        "a refused first barrier left the MV's folder behind, empty"


@pytest.mark.parametrize("mode", ["arrangement", "snapshot"])
def test_a_repeated_key_refuses_a_new_mv_and_leaves_nothing(spark, warehouse, mode):
    live = H.orders(warehouse, 33)
    live.create(rows=60)
    key = sorted(live.keys)[0]
    write_deltalake(live.uri, _duplicate(live, key).slice(0, 1), mode="append")
    raw = H.mv_raw(f"dupnew_{mode}", mode, 5, live.uri)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    refused(spark, d, tables, errors.BadPrimaryKeyInUpstream,
            rf"2 rows with the primary key \(id={key}\).*fix those rows")
    _no_state_left(tables)


def test_an_unknown_reader_feature_refuses_a_new_mv_before_any_write(spark, warehouse):
    uri = f"{warehouse}/widened"
    _foreign(uri, _foreign_rows(20), FOREIGN)
    with open(os.path.join(uri, "_delta_log", "00000000000000000001.json"), "w") as f:
        f.write('{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, '
                '"readerFeatures": ["typeWidening"], "writerFeatures": ["typeWidening"]}}\n')
    d, tables = _foreign_mv(warehouse, uri, "widened_mv")
    refused(spark, d, tables, errors.UnsupportedTableFeature, r"typeWidening.*Rewrite the table")
    _no_state_left(tables)


def test_an_aggregate_mv_re_snapshot_in_arrangement_mode_is_refused_by_name(spark, warehouse):
    """Aggregate MVs run in every mode; a re-snapshot (every group recomputed at one version)
    is the snapshot mode's alone, and an arrangement one is refused before anything is
    written (the backfill restarts by reset)."""
    from backfill_assets import aggregate
    from backfill_assets.mv.controls import Controls

    live = H.orders(warehouse, 34)
    live.create(rows=40)
    raw = H.mv_raw("agg_new", "arrangement", 5, live.uri)
    for key in ("columns", "computed"):
        raw.pop(key)
    raw.update(group_by=["name"], aggregates={"total": "sum(amount)", "n": "count(*)"})
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    with pytest.raises(errors.AggregateModeUnsupported, match="re-snapshotted in snapshot"):
        aggregate.run_barrier(spark, d, tables, [0], controls=Controls(), recompute=True)
    _no_state_left(tables)
