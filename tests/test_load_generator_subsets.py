"""The load generator's knobs the benchmarks use: a subset of the generated columns, the rows
per initial-load version, and DML drawn over an initial load without reading its keys
(`Generator.over_initial_ids`). The oracle is the table itself: what delta-rs reads back."""

from __future__ import annotations

import os

import pytest

from backfill_assets import storage
from backfill_assets.core.errors import InvalidUpstreamSpec
from backfill_assets.upstream.writer import (
    REGIONS,
    Generator,
    InitialIds,
    LoadParams,
    apply_dml,
    demo_columns,
    initial_rows_table,
    read_upstream_spec,
    row_count,
    run_load,
)

SUBSET = ("region", "id", "name", "amount", "qty", "ts", "day", "flag")


def _keys(uri: str) -> set[tuple[str, int]]:
    rows = storage.read_table(uri, columns=["region", "id"])
    return set(zip(rows.column("region").to_pylist(), rows.column("id").to_pylist(),
                   strict=True))


def _drawn_from(live: InitialIds) -> set[tuple[str, int]]:
    """Every key ``live`` can still draw: the initial ids not removed, and those added."""
    initial = {(REGIONS[i % len(REGIONS)], i) for i in range(live.count) if i not in live.removed}
    return initial | set(live.added.keys)


def test_a_column_subset_loaded_in_batches_of_the_given_size(warehouse):
    uri = os.path.join(warehouse, "up")
    done = run_load(uri, LoadParams(seed=4, initial_rows=5000, versions=0, columns=SUBSET,
                                    load_batch=2000), vnode_count=16)
    spec = read_upstream_spec(uri)
    assert tuple(spec.columns) == SUBSET and spec.primary_key == ("id",)
    assert done.last_version == 3 and done.row_count == row_count(uri) == 5000  # 2000+2000+1000
    got = storage.read_table(uri, columns=list(SUBSET)).sort_by("id")
    assert got.to_pylist() == initial_rows_table(4, 0, 5000).select(list(SUBSET)).to_pylist()


@pytest.mark.parametrize("composite", [False, True])
def test_dml_over_initial_ids_keeps_the_tables_keys(warehouse, composite):
    """Batch after batch, the keys `InitialIds` can draw are exactly the table's live keys,
    and every batch applies (an update or delete of a missing key would be refused)."""
    uri = os.path.join(warehouse, "up")
    run_load(uri, LoadParams(seed=2, initial_rows=600, versions=0, columns=SUBSET),
             vnode_count=8, composite_key=composite)
    gen = Generator.over_initial_ids(read_upstream_spec(uri), seed=9, count=600)
    weights = LoadParams(mix={"insert": 1, "update": 1, "delete": 1, "pk_change": 1,
                              "upsert": 1}).weights()
    for i in range(1, 6):
        batch = gen.batch(i, 60, weights)
        assert batch.deletes and batch.pk_changes and batch.updates
        assert all(set(row) <= set(SUBSET) for row in batch.inserts + batch.upserts)
        apply_dml(uri, batch, spec=gen.spec)
        assert _drawn_from(gen.live) == _keys(uri)
        assert len(gen.live) == row_count(uri)


def test_the_live_keys_read_back_draw_the_same_set(warehouse):
    uri = os.path.join(warehouse, "up")
    run_load(uri, LoadParams(seed=3, initial_rows=400, versions=3, changes_per_version=50),
             vnode_count=8)
    gen = Generator.reading(uri, seed=1)
    assert set(gen.live.keys) == _keys(uri) and gen.next_id > 399


def test_a_wrong_column_subset_is_refused_before_anything_is_written(warehouse):
    uri = os.path.join(warehouse, "up")
    for columns in (("id", "name"), ("region", "id", "bogus")):
        with pytest.raises(InvalidUpstreamSpec, match="must include region and id"):
            run_load(uri, LoadParams(initial_rows=10, versions=0, columns=columns))
        assert not os.path.exists(uri)
    assert list(demo_columns(SUBSET)) == list(SUBSET)
