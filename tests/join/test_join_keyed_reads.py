"""A join MV's index tables (which carry the fact rows) are written in small row groups and
read by key (`storage.rows_of_keys`), the dimension table held whole in the process
(join/held.py: brought forward by its own commits); an index without
`backfill.rowGroupRows` is read by vnode. Either way every barrier's MV equals Spark SQL's
join (verify/join_oracle.py). State made by the layout before (a facts table) is refused by
name, saying to reset the MV."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from backfill_assets import storage
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import JoinStateLayoutOutdated
from backfill_assets.join import held
from backfill_assets.join import store as join_store
from backfill_assets.mv.owned_tables import read_rows
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw, left_join_mv
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _groups(snap: storage.TableVersion) -> list[int]:
    """The rows of each row group of the table's live files."""
    found = []
    for f in snap.files:
        md = pq.ParquetFile(snap.file_uri(f.path)).metadata
        found += [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    return found


@pytest.mark.parametrize("layout", [
    "keyed", pytest.param("legacy", marks=pytest.mark.variant)])  # CI time
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
    index = storage.TableVersion.load(f"{root}/index_0")
    dimension = storage.TableVersion.load(f"{root}/dimension_0")
    for snap in (index,):
        grouped = storage.ROW_GROUP_ROWS_PROPERTY in snap.configuration
        assert grouped == (layout == "keyed")
        if grouped:  # the Spark bulk commit honours the property
            groups = _groups(snap)
            assert max(groups) <= 1024 and len(groups) >= 5
    assert storage.ROW_GROUP_ROWS_PROPERTY not in dimension.configuration
    if layout == "keyed":  # one join key's index rows lie in a few of the table's groups
        keys = read_rows(index.table, columns=["qty", "vnode"]).slice(0, 1)
        opened = sum(len(g) for g in storage.row_groups_read(index, ["qty"], keys).values())
        assert 0 < opened < len(_groups(index))
    assert_exact(spark, d, tables)
    for n in range(4):
        dim.random_dml()
        if n % 2:
            live.apply(live.random_batch(30))
        report = run_barrier(spark, d, tables, [0])
        assert report.extra["join_path"] == "apply"
        assert_exact(spark, d, tables)
        # the dimension this process holds is the table's latest version, row for row
        snap = storage.TableVersion.load(f"{root}/dimension_0")
        rows = held.rows_at(snap)
        assert rows is not None
        assert sorted(rows.to_pylist(), key=repr) == \
            sorted(read_rows(snap.table).select(rows.schema.names).to_pylist(), key=repr)


def test_state_made_by_the_layout_before_is_refused_saying_to_reset(spark, warehouse):
    import pyarrow as pa
    from deltalake import write_deltalake

    live, _, d, tables = left_join_mv(spark, warehouse, 58, "old_layout", rows=50, keys=5)
    run_barrier(spark, d, tables, [0])
    write_deltalake(f"{tables.join_state}/facts", pa.table({"id": [1]}))  # the old layout's
    live.apply(live.random_batch(5))
    owned = [tables.mv, tables.progress, f"{tables.join_state}/index_0",
             f"{tables.join_state}/dimension_0"]
    before = [H.latest(uri) for uri in owned]
    with pytest.raises(JoinStateLayoutOutdated, match="reset the MV"):
        run_barrier(spark, d, tables, [0])
    assert [H.latest(uri) for uri in owned] == before, "the refused barrier wrote a commit"
