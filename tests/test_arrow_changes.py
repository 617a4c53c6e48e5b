"""The driver's visibility filter (`arrow_changes.visible`) keeps exactly the rows of the
Spark path's (`mv_spark.visible_rows`): a chunked barrier forwards the same changes whichever
engine nets them. Composite keys with a descending column and strings (byte order), every
progress state (Completed, InProgress at a key or at the empty vnode's placeholder,
NotStarted)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets import arrow_changes
from backfill_assets.core.key_types import KeyColumn
from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.progress import Completed, InProgress, NotStarted
from backfill_assets.mv_spark import visible_rows
from backfill_assets.spark_ops import spark_schema

ORDER = KeyOrder((KeyColumn("region", "string"), KeyColumn("id", "bigint", descending=True)))
REGIONS = ["a", "b", "ä", "B", "ab"]


def _rows(seed: int) -> pa.Table:
    rng = random.Random(seed)
    rows = [{"region": rng.choice(REGIONS), "id": rng.randint(-5, 5), "vnode": rng.randint(0, 5),
             "name": "x"} for _ in range(300)]
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("region", pa.string()), ("id", pa.int64()), ("vnode", pa.int32()),
        ("name", pa.string())]))


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_visible_on_the_driver_equals_the_spark_filter(spark, seed):
    rng = random.Random(seed)
    progress = {0: Completed(("b", 3), 10), 1: InProgress(("b", 0), 4),
                2: InProgress(("ä", -2), 4), 3: InProgress(ORDER.placeholder(), 0),
                4: NotStarted(), 5: InProgress((rng.choice(REGIONS), rng.randint(-5, 5)), 1)}
    rows = _rows(seed)
    driver = arrow_changes.visible(rows, progress, ORDER)
    df = spark.createDataFrame(rows, schema=spark_schema(rows.schema))
    on_spark = visible_rows(df, progress, ORDER).toArrow()

    def key(t: pa.Table) -> list:
        return sorted((r["vnode"], r["region"], r["id"]) for r in t.to_pylist())

    assert key(driver) == key(on_spark)
    assert 0 < driver.num_rows < rows.num_rows
