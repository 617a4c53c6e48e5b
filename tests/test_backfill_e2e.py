"""End to end: real Spark, real Delta, the independent oracle after every barrier.

Every scenario runs in every mode where the upstream allows it (no_shuffle needs an upstream
arranged by the same vnodes; rescales are refused for it by design). Snapshot mode runs with
small slices (SLICES), so its first barrier commits several slices.
"""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import NoShuffleLayoutMismatch
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.progress import Completed
from backfill_assets.core.vnode import vnode_of
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import read_progress
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.upstream.writer import UpstreamSpec
from tests.support import LiveUpstream, assert_verified, drive, simple_mv, simple_row, simple_spec

# no_shuffle's e2e variants are the slowest (one barrier per 32-row chunk): `make test-all`
MODES = ["arrangement", pytest.param("no_shuffle", marks=pytest.mark.variant), "snapshot"]
VNODES = 8
SLICES = {"snapshot": {"slice_rows": 40}}  # ~3 vnodes of these tables per slice


def _live(warehouse: str, seed: int, avoid_vnode: int | None = None) -> LiveUpstream:
    def key(rng: random.Random) -> int:
        while True:
            k = rng.randint(1, 10_000)
            if avoid_vnode is None or vnode_of((k,), ("bigint",), VNODES) != avoid_vnode:
                return k

    return LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(seed),
                        simple_row, key)


def _progress(d: MVDefinition, tables: MVTables) -> dict:
    key_order = checked_upstream(tables, d, None).key_order
    return read_progress(DeltaTable(tables.progress), key_order, range(d.vnode_count))


@pytest.mark.parametrize("mode", MODES)
def test_many_barriers_with_live_dml(spark, warehouse, mode):
    live = _live(warehouse, seed=1)
    live.create(rows=120)
    d = simple_mv(VNODES, mode=mode, chunk_size=6, **SLICES.get(mode, {}))
    tables = MVTables.under(warehouse, d.name, "orders")
    stats = drive(spark, d, tables, live, ranges=[range(VNODES)], changes_per_barrier=6)
    assert stats["barriers"] >= 4 and stats["forwarded_rows"] > 0


@pytest.mark.parametrize("mode", ["arrangement", pytest.param("no_shuffle",
                                                                marks=pytest.mark.variant)])
def test_chunked_barriers_whose_changes_go_through_spark(spark, warehouse, mode, monkeypatch):
    """More change rows than `SMALL_BARRIER_ROWS` (forced to 0 here) leave the driver: the
    forwarded and replicated changes take the Spark merge, beside the same chunks."""
    from backfill_assets.step import loop

    monkeypatch.setattr(loop, "SMALL_BARRIER_ROWS", 0)
    live = _live(warehouse, seed=5)
    live.create(rows=120)
    d = simple_mv(VNODES, mode=mode, chunk_size=6)
    tables = MVTables.under(warehouse, d.name, "orders")
    stats = drive(spark, d, tables, live, ranges=[range(VNODES)], changes_per_barrier=6)
    assert stats["barriers"] >= 4 and stats["forwarded_rows"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_empty_vnode_and_vnode_emptied_mid_backfill(spark, warehouse, mode):
    """Vnode 3 never has a row; every row of vnode 5 is deleted after two barriers."""
    live = _live(warehouse, seed=2, avoid_vnode=3)
    live.create(rows=100)
    d = simple_mv(VNODES, mode=mode, chunk_size=4, **SLICES.get(mode, {}))
    tables = MVTables.under(warehouse, d.name, "orders")

    def empty_vnode_5(n: int) -> None:
        if n == 2:
            live.delete_where(lambda k: vnode_of((k,), ("bigint",), VNODES) == 5)

    drive(spark, d, tables, live, ranges=[range(VNODES)], changes_per_barrier=4,
          between=empty_vnode_5)
    progress = _progress(d, tables)
    empty = progress[3][0]
    assert isinstance(empty, Completed) and empty.row_count == 0
    if mode != "no_shuffle":  # no_shuffle moves the one shared position over it instead
        assert all(v is None for v in empty.current_pos)  # the all-null placeholder
    assert all(isinstance(p, Completed) for p, _ in progress.values())


COMPOSITE = {"region": "string", "id": "bigint", "day": "date", "qty": "int", "name": "string"}


def _composite_row(rng: random.Random, key: tuple) -> dict:
    return {"region": key[0], "id": key[1], "name": rng.choice(["x", "y", "z"]),
            "qty": rng.randint(0, 9), "day": dt.date(2025, 1, 1) + dt.timedelta(rng.randint(0, 99))}


@pytest.mark.parametrize("mode", MODES)
def test_composite_pk_with_descending_column(spark, warehouse, mode):
    spec = UpstreamSpec(name="events", columns=COMPOSITE, primary_key=("region", "id"),
                        vnode_count=VNODES)
    live = LiveUpstream(f"{warehouse}/events", spec, random.Random(3), _composite_row,
                        lambda rng: (rng.choice(["eu", "us", "apac"]), rng.randint(-500, 500)))
    live.create(rows=150)
    d = MVDefinition.from_dict({
        "name": f"by_region_{mode}", "upstream": "events", "mode": mode, "chunk_size": 7,
        "primary_key": ["region", {"name": "id", "descending": True}],
        "columns": ["region", "id", "qty", "day"], "filter": "qty % 3 <> 0",
        "computed": [{"name": "week", "expr": "weekofyear(day)"}], "vnode_count": VNODES,
        **SLICES.get(mode, {})})
    tables = MVTables.under(warehouse, d.name, "events")
    drive(spark, d, tables, live, ranges=[range(VNODES)], changes_per_barrier=8)


@pytest.mark.parametrize("mode", ["arrangement", "snapshot"])
def test_rescale_between_barriers(spark, warehouse, mode):
    """Arrangement vnode ranges are re-split at every barrier; positions are per vnode (snapshot
    mode: the slices of the first barrier, then catch-up over re-split ranges)."""
    live = _live(warehouse, seed=4)
    live.create(rows=160)
    d = simple_mv(VNODES, mode=mode, chunk_size=5, **SLICES.get(mode, {}))
    tables = MVTables.under(warehouse, d.name, "orders")
    layouts = [[range(8)], [range(0, 3), range(3, 8)], [range(0, 6), range(6, 8)],
               [range(0, 1), range(1, 2), range(2, 8)]]
    drive(spark, d, tables, live, ranges=lambda n: layouts[n % len(layouts)],
          changes_per_barrier=6)


@pytest.mark.parametrize("mode", ["arrangement", "snapshot"])
def test_upstream_the_platform_did_not_create(spark, warehouse, mode):
    """Plain deltalake table: no vnode column, partitioned by region; pk declared in the MV
    (snapshot mode: the vnode is computed from the key, duplicates are checked)."""
    uri = f"{warehouse}/foreign"
    rng = random.Random(5)
    rows = {i: {"region": rng.choice(["a", "b"]), "id": i, "qty": rng.randint(0, 9)}
            for i in range(1, 201)}
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("qty", pa.int32())])
    write_deltalake(uri, pa.Table.from_pylist(list(rows.values()), schema), partition_by=["region"],
                    configuration={"delta.enableChangeDataFeed": "true"})
    d = MVDefinition.from_dict({"name": "foreign_mv", "upstream": uri, "primary_key": ["id"],
                                "columns": ["id", "region", "qty"], "chunk_size": 9,
                                "vnode_count": VNODES, "mode": mode, **SLICES.get(mode, {})})
    tables = MVTables.under(warehouse, d.name, uri)
    for n in range(60):
        # another engine's DML: merge updates + inserts, and deletes
        changed = [{"region": rng.choice(["a", "b"]), "id": rng.randint(1, 260),
                    "qty": rng.randint(0, 9)} for _ in range(5)]
        changed = list({r["id"]: r for r in changed}.values())
        (DeltaTable(uri).merge(pa.Table.from_pylist(changed, schema), "t.id = s.id",
                               source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
        DeltaTable(uri).delete(f"id = {rng.randint(1, 260)}")
        reports = [run_barrier(spark, d, tables, list(range(VNODES)))]
        assert_verified(spark, d, tables)
        if all(r.finished for r in reports) and n > 3:
            break
    assert all(r.finished for r in reports)
    if mode == "snapshot":
        return
    no_shuffle = MVDefinition.from_dict({**d.__dict__, "mode": "no_shuffle",
                                         "name": "foreign_ns", "primary_key": ["id"],
                                         "computed": [], "filter": None})
    with pytest.raises(NoShuffleLayoutMismatch):
        run_barrier(spark, no_shuffle, MVTables.under(warehouse, "foreign_ns", uri),
                    list(range(VNODES)))
