"""A join MV's facts and index tables are written in small row groups and read by key
(`storage.rows_of_keys`), the dimension table by vnode; state tables created before that
layout (no `backfill.rowGroupRows`) keep being read by vnode. Either way every barrier's MV
equals Spark SQL's join (verify/join_oracle.py)."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from backfill_assets import storage
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.join import store as join_store
from backfill_assets.mv.owned_tables import read_rows
from backfill_assets.storage.rows.keyed_read import row_groups_read
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _groups(snap: storage.TableVersion) -> list[int]:
    """The rows of each row group of the table's live files."""
    found = []
    for f in snap.files:
        md = pq.ParquetFile(snap.file_uri(f.path)).metadata
        found += [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    return found


@pytest.mark.parametrize("layout", ["keyed", "legacy"])
def test_dimension_barriers_read_the_state_by_key(spark, warehouse, monkeypatch, layout):
    rng = random.Random(57)
    live = H.orders(warehouse, 57)
    live.create(rows=6000)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 14))
    raw = join_raw(f"keyed_{layout}", live.uri, "left")
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    if layout == "legacy":  # the state tables as a join MV created before the layout has them
        monkeypatch.setattr(join_store, "KEYED_LAYOUT", None)
    assert run_barrier(spark, d, tables, [0]).extra["join_path"] == "bulk"
    monkeypatch.undo()
    root = tables.join_state
    facts, index = (storage.TableVersion.load(f"{root}/{t}") for t in ("facts", "index_0"))
    dimension = storage.TableVersion.load(f"{root}/dimension_0")
    for snap in (facts, index):
        grouped = storage.ROW_GROUP_ROWS_PROPERTY in snap.configuration
        assert grouped == (layout == "keyed")
        if grouped:  # the Spark bulk commit honours the property
            groups = _groups(snap)
            assert max(groups) <= 1024 and len(groups) >= 5
    assert storage.ROW_GROUP_ROWS_PROPERTY not in dimension.configuration
    if layout == "keyed":  # one join key's index rows lie in a few of the table's groups
        keys = read_rows(index.table, columns=["qty", "vnode"]).slice(0, 1)
        opened = sum(len(g) for g in row_groups_read(index, ["qty"], keys).values())
        assert 0 < opened < len(_groups(index))
    assert_exact(spark, d, tables)
    for n in range(4):
        dim.random_dml()
        if n % 2:
            live.apply(live.random_batch(30))
        report = run_barrier(spark, d, tables, [0])
        assert report.extra["join_path"] == "apply"
        assert_exact(spark, d, tables)
