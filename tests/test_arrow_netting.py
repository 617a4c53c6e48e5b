"""The driver's visibility filter (`arrow.netting.visible`) keeps exactly the rows of the Spark
path's (`engine.projection.visible_rows`): a chunked barrier forwards the same changes whichever
engine nets them. Composite keys with a descending column and strings (byte order), a single
integer key both ways (the vectorised comparison), every progress state (Completed, InProgress
at a key or at the empty vnode's placeholder, NotStarted)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets.arrow import netting
from backfill_assets.core.key_types import KeyColumn
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.progress import Completed, InProgress, NotStarted
from backfill_assets.engine.projection import visible_rows
from backfill_assets.storage import spark_schema

REGIONS = ["a", "b", "ä", "B", "ab"]
ORDERS = {
    "composite": KeyOrder((KeyColumn("region", "string"),
                           KeyColumn("id", "bigint", descending=True))),
    "bigint": KeyOrder((KeyColumn("id", "bigint"),)),
    "int descending": KeyOrder((KeyColumn("id", "int", descending=True),)),
}


def _rows(rng: random.Random) -> pa.Table:
    rows = [{"region": rng.choice(REGIONS), "id": rng.randint(-5, 5), "vnode": rng.randint(0, 5),
             "name": "x"} for _ in range(300)]
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("region", pa.string()), ("id", pa.int64()), ("vnode", pa.int32()),
        ("name", pa.string())]))


def _key(order: KeyOrder, rng: random.Random) -> tuple:
    values = {"region": rng.choice(REGIONS), "id": rng.randint(-4, 4)}
    return tuple(values[c.name] for c in order.columns)


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("shape", list(ORDERS))
def test_visible_on_the_driver_equals_the_spark_filter(spark, seed, shape):
    rng, order = random.Random(seed), ORDERS[shape]
    rows = _rows(rng)
    progress = {0: Completed(_key(order, rng), 10), 1: InProgress(_key(order, rng), 4),
                2: InProgress(_key(order, rng), 4), 3: InProgress(order.placeholder(), 0),
                4: NotStarted(), 5: InProgress(_key(order, rng), 1)}
    driver = netting.visible(rows, progress, order)
    df = spark.createDataFrame(rows, schema=spark_schema(rows.schema))
    on_spark = visible_rows(df, progress, order).toArrow()

    def key(t: pa.Table) -> list:
        return sorted((r["vnode"], r["region"], r["id"]) for r in t.to_pylist())

    assert key(driver) == key(on_spark)
    assert 0 < driver.num_rows < rows.num_rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_by_keys_keeps_order_and_null_typed_columns(seed):
    """`rows_by_keys` equals a per-row membership test on the composite key, in the rows'
    order, with a column of Arrow type null beside the keys (Arrow's own join refuses such a
    non-key column: an upstream column never set reaches the replica's netting that way)."""
    rng = random.Random(seed)
    rows = _rows(rng).append_column("never_set", pa.nulls(300))
    keys = pa.Table.from_pylist([{"region": rng.choice(REGIONS), "id": rng.randint(-5, 5)}
                                 for _ in range(20)])
    wanted = {(k["region"], k["id"]) for k in keys.to_pylist()}
    names = ["region", "id"]
    for how, inside in (("left semi", True), ("left anti", False)):
        got = netting.rows_by_keys(rows, keys, names, how)
        expected = [r for r in rows.to_pylist() if ((r["region"], r["id"]) in wanted) == inside]
        assert got.schema == rows.schema and got.to_pylist() == expected


def _one_version_changes(rng: random.Random, versions: int) -> pa.Table:
    """Change rows as a pk-respecting writer makes them: per version, each key at most once
    inserted / post-imaged and at most once deleted / pre-imaged (composite keys)."""
    rows = []
    for version in range(1, versions + 1):
        for region in REGIONS:
            for key in rng.sample(range(-6, 6), rng.randint(0, 6)):
                kind = rng.choice(["insert", "delete", "update", "delete+insert"])
                sides = {"insert": ["insert"], "delete": ["delete"],
                         "update": ["update_preimage", "update_postimage"],
                         "delete+insert": ["delete", "insert"]}[kind]
                rows += [{"region": region, "id": key, "name": f"{side}{version}",
                          "_change_type": side, "_commit_version": version} for side in sides]
    rng.shuffle(rows)
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("region", pa.string()), ("id", pa.int64()), ("name", pa.string()),
        ("_change_type", pa.string()), ("_commit_version", pa.int64())]))


@pytest.mark.parametrize("versions", [1, 3])
def test_a_checked_range_is_netted_as_the_sorted_rule_nets_it(versions: int) -> None:
    """``checked``: one version is split by side without the sort, more versions take the
    sort; either way the same rows before and after, and the same count of keys."""
    rng = random.Random(versions)
    for _ in range(30):
        raw = _one_version_changes(rng, versions)
        plain = netting.net_with_prior(raw, ["region", "id"])
        fast = netting.net_with_prior(raw, ["region", "id"], checked=True)
        order = [("region", "ascending"), ("id", "ascending")]
        assert fast.before.sort_by(order).equals(plain.before.sort_by(order))
        assert fast.after.sort_by(order).equals(plain.after.sort_by(order))
        assert fast.keys == plain.keys
