"""Join MVs run as barriers: after every barrier the MV equals Spark SQL's [LEFT] JOIN of the
fact at its recorded version and the dimension at its own (verify/join_oracle.py), under
random DML on both sides: the platform's writer on the fact (join keys changing, pk changes,
deletes), a Delta-Spark writer on the dimension (rows updated, deleted and re-added, late
rows that fill in left-joined facts), and barriers where only one side moved."""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.join import barrier_due
from backfill_assets.verify.join_oracle import verify_join
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REGIONS = ("north", "south", "east", "west", None)


class Dimension:
    """A dimension table created and changed only through Delta-Spark SQL, keyed by `q`."""

    def __init__(self, spark, uri: str, rng: random.Random):
        self.spark, self.uri, self.rng, self.keys = spark, uri, rng, set()
        spark.sql(f"CREATE TABLE delta.`{uri}` (q INT, region STRING, tier INT) USING delta "
                  "TBLPROPERTIES (delta.enableChangeDataFeed = true, "
                  "delta.enableDeletionVectors = true)")

    def _row(self, q: int) -> str:
        region = self.rng.choice(REGIONS)
        return f"({q}, {'NULL' if region is None else repr(region)}, {self.rng.randint(0, 3)})"

    def insert(self, keys) -> None:
        keys = [k for k in keys if k not in self.keys]
        if keys:
            self.spark.sql(f"INSERT INTO delta.`{self.uri}` VALUES "
                           + ", ".join(self._row(q) for q in keys))
            self.keys |= set(keys)

    def random_dml(self) -> None:
        """An update, a delete and an insert (a late key or one deleted before)."""
        live = sorted(self.keys)
        if live:
            q = self.rng.choice(live)
            self.spark.sql(f"UPDATE delta.`{self.uri}` SET region = "
                           f"'{self.rng.choice(REGIONS[:4])}', tier = tier + 1 WHERE q = {q}")
            gone = self.rng.choice(live)
            self.spark.sql(f"DELETE FROM delta.`{self.uri}` WHERE q = {gone}")
            self.keys.discard(gone)
        self.insert([self.rng.choice([k for k in range(0, 21) if k not in self.keys] or [0])])


def join_raw(name: str, upstream: str, kind: str, **extra) -> dict:
    """Orders enriched with their qty's tier: a filter and a computed column over joined
    columns, a carried column renamed."""
    return {"name": name, "upstream": upstream, "primary_key": ["id"],
            "columns": ["id", "name", "amount", "qty", "region", "tier_level"],
            "joins": [{"table": "tiers", "key": ["q"], "on": {"qty": "q"},
                       "columns": ["region", {"name": "tier_level", "column": "tier"}],
                       "kind": kind}],
            "filter": "tier_level IS NULL OR tier_level < 3",
            "computed": [{"name": "label", "expr": "concat(name, '@', coalesce(region, '-'))"}],
            "vnode_count": 8, **extra}


def left_join_mv(spark, warehouse: str, seed: int, name: str, rows: int, keys: int):
    """An orders upstream of ``rows`` rows, a tiers dimension of ``keys`` keys and the row MV
    over their left join, not yet run: (live, dim, d, tables)."""
    live = H.orders(warehouse, seed)
    live.create(rows=rows)
    dim = Dimension(spark, f"{warehouse}/tiers", random.Random(seed))
    dim.insert(range(0, keys))
    raw = join_raw(name, live.uri, "left")
    return live, dim, H.definition(raw), H.tables_of(warehouse, raw)


def assert_exact(spark, d, tables) -> int:
    verdict = verify_join(spark, d, tables)
    assert verdict.ok, (verdict.pair, verdict.missing, verdict.extra)
    return verdict.rows_compared


@pytest.mark.parametrize("kind", ["left", "inner"])
def test_join_mv_equals_spark_join_after_every_barrier(spark, warehouse, kind):
    rng = random.Random(50)
    live = H.orders(warehouse, 50)
    live.create(rows=120)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 14))  # qty runs 0..20: the rest are late rows
    raw = join_raw(f"joined_{kind}", live.uri, kind)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    first = run_barrier(spark, d, tables, [0])
    assert first.finished and first.extra["join_path"] == "bulk"
    assert assert_exact(spark, d, tables) > 20
    for n in range(6):
        if n != 2:  # a barrier where only the dimension moved
            live.apply(live.random_batch(10))
        if n != 4:  # and one where only the fact moved
            dim.random_dml()
        assert barrier_due(d, tables)
        report = run_barrier(spark, d, tables, list(range(8)))
        assert report.extra["join_path"] == "apply"
        if n == 2:  # a dimension change reaches its facts through the index, no scan
            assert report.extra["fact_changes"] == 0
            assert 0 < report.extra["facts_reached"] < 60
        assert report.v_new == H.latest(live.uri)
        assert report.extra["dimension_versions"] == [H.latest(dim.uri)]
        assert_exact(spark, d, tables)
    dim.insert(range(0, 21))  # every late row arrives: each padded fact is filled in
    report = run_barrier(spark, d, tables, [0])
    assert report.extra["fact_changes"] == 0 and report.extra["dimension_changes"] > 0
    assert_exact(spark, d, tables)
    assert not barrier_due(d, tables)
    idle = run_barrier(spark, d, tables, [0])
    assert idle.v_new == report.v_new
    assert_exact(spark, d, tables)


def test_an_aggregate_over_the_join_equals_spark_join_and_group_by(spark, warehouse):
    """Revenue per region (a joined column): a dimension change moves orders between
    groups without a fact change; counts, exact decimal sums and averages, max, and
    count(DISTINCT) of a fact column."""
    rng = random.Random(53)
    live = H.orders(warehouse, 53)
    live.create(rows=150)
    dim = Dimension(spark, f"{warehouse}/tiers", rng)
    dim.insert(range(0, 15))
    raw = join_raw("joined_agg", live.uri, "left")
    del raw["columns"]
    raw |= {"group_by": ["region"],
            "aggregates": {"revenue": "sum(amount)", "orders": "count(*)",
                           "avg_amount": "avg(amount)", "top": "max(amount)",
                           "names": "count(DISTINCT name)", "tiers": "sum(tier_level)"}}
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    assert run_barrier(spark, d, tables, [0]).extra["join_path"] == "bulk"
    assert_exact(spark, d, tables)
    for n in range(4):
        if n != 1:
            live.apply(live.random_batch(10))
        dim.random_dml()
        run_barrier(spark, d, tables, [0])
        assert_exact(spark, d, tables)
