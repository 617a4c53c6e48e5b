"""Join MVs under random DML drawn from a seed on both sides, each side written by Delta-Spark:
the fact table by a streaming MERGE writer (updates, inserts, deletes, pk moves; join keys
changing, null join keys), the dimension by SQL (updates, deletes, late rows, a row deleted and
re-added inside one barrier, a row whose key is null). After every barrier the MV equals Spark
SQL's join at the recorded pair (verify/join_oracle.py) and Delta-Spark's read of the MV agrees
with delta-rs'. A second test kills real barrier processes at random commit points of random
barriers (BACKFILL_TEST_KILL_AT through the light child) and checks the recovery lands exactly
on the join, with an aggregate over the join."""

from __future__ import annotations

import itertools
import random
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from backfill_assets.barrier.runner import run_barrier
from tests.interop.delta_spark import multiset, spark_rows
from tests.interop.spark_upstream import Features, SparkUpstream
from tests.join.test_join_barriers import Dimension, assert_exact, join_raw
from tests.join.test_join_kills import HELD
from tests.reliability import harness as H
from tests.reliability.drawn_kills import kill_at_points
from tests.support import SIMPLE_COLUMNS, simple_row

pytestmark = pytest.mark.spark
SETTINGS = {"deadline": None, "phases": [Phase.explicit, Phase.generate],
            "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
EXAMPLES = itertools.count()  # a fresh folder per example


def fact_row(rng: random.Random, key: object) -> dict:
    """The orders row, its join key (qty) sometimes null or beyond every dimension key."""
    row = simple_row(rng, key)
    row["qty"] = rng.choice([None, 25, *range(0, 21)])
    if rng.random() < 0.1:
        row["amount"] = Decimal("9999999999.99")
    return row


def fact_writer(spark, uri: str, seed: int, rows: int) -> SparkUpstream:
    up = SparkUpstream(spark, uri, Features(), random.Random(seed), dict(SIMPLE_COLUMNS),
                       key="id", make_row=fact_row)
    up.create(rows)
    return up


class Dim(Dimension):
    """The tiers dimension plus the moves a random history needs."""

    def readd(self) -> None:
        """DELETE a live key, then INSERT it back with other values: two commits, one barrier."""
        if self.keys:
            q = self.rng.choice(sorted(self.keys))
            self.spark.sql(f"DELETE FROM delta.`{self.uri}` WHERE q = {q}")
            self.keys.discard(q)
            self.insert([q])

    def null_key(self) -> None:
        self.spark.sql(f"INSERT INTO delta.`{self.uri}` VALUES (NULL, 'nowhere', 1)")

    def step(self) -> str:
        move = self.rng.choice(["dml", "dml", "readd", "null", "none"])
        {"dml": self.random_dml, "readd": self.readd, "null": self.null_key,
         "none": lambda: None}[move]()
        return move


def fact_step(up: SparkUpstream) -> str:
    kind = up.rng.choice(["merge", "merge", "move", "update", "none"])
    if kind == "merge":
        up.merge(up.rng.randint(1, 6), up.rng.randint(0, 4), up.rng.randint(0, 3))
    elif kind == "move":
        up.move_keys(2)
    elif kind == "update":
        up.update(3)
    return kind


def _aggregated(raw: dict) -> dict:
    """The join's aggregate: per joined region (null for padded facts)."""
    out = {k: v for k, v in raw.items() if k != "columns"}
    return {**out, "group_by": ["region"],
            "aggregates": {"orders": "count(*)", "revenue": "sum(amount)",
                           "top": "max(amount)", "tiers": "count(DISTINCT tier_level)",
                           "mean": "avg(qty)"}}


def _setup(spark, warehouse: str, seed: int, kind: str, aggregate: bool):
    n = next(EXAMPLES)
    rng = random.Random(seed)
    up = fact_writer(spark, f"{warehouse}/facts_{n}", seed, rows=70)
    dim = Dim(spark, f"{warehouse}/tiers_{n}", rng)
    dim.insert(rng.sample(range(0, 21), 12))
    raw = join_raw(f"gen_join_{n}", up.uri, kind)
    raw["joins"][0]["table"] = dim.uri
    raw = _aggregated(raw) if aggregate else raw
    return up, dim, raw


@settings(max_examples=1, derandomize=True, **SETTINGS)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(["left", "inner"]),
       aggregate=st.booleans())
def test_a_drawn_join_history_equals_spark_join_after_every_barrier(spark, warehouse, seed,
                                                                   kind, aggregate):
    drawn_history(spark, warehouse, seed, kind, aggregate, barriers=6)


@pytest.mark.variant
@settings(max_examples=6, **SETTINGS)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(["left", "inner"]),
       aggregate=st.booleans())
def test_more_drawn_join_histories(spark, warehouse, seed, kind, aggregate):
    drawn_history(spark, warehouse, seed, kind, aggregate, barriers=10)


def drawn_history(spark, warehouse: str, seed: int, kind: str, aggregate: bool,
                  barriers: int) -> None:
    """``barriers`` barriers of drawn DML on both sides, the join's oracle and both readers
    after each."""
    up, dim, raw = _setup(spark, warehouse, seed, kind, aggregate)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    history: list = [kind, aggregate]
    for n in range(barriers):
        if n:
            history.append((fact_step(up), dim.step()))
        run_barrier(spark, d, tables, list(range(8)))
        try:
            assert_exact(spark, d, tables)
            ours = multiset(spark_rows(spark, tables.mv))  # Delta-Spark reads what delta-rs does
            theirs = multiset(pa.table(DeltaTable(tables.mv).scan()).to_pylist())
            assert ours == theirs, "Delta-Spark and delta-rs read different MV rows"
        except AssertionError as e:
            raise AssertionError(f"barrier {n} of {history}: {e}") from e


KILLS = [p for p in HELD if p != "before_write"]


@pytest.mark.variant
@settings(max_examples=1, derandomize=True, **SETTINGS)
@given(seed=st.integers(0, 2**31))
def test_random_kills_on_both_feeds_recover_exactly(spark, warehouse, seed):
    """Barriers where both sides moved, each killed at a drawn commit point (some twice in a
    row: a recovery killed too), then finished in this process; the MV equals Spark's join
    and GROUP BY after each."""
    up, dim, raw = _setup(spark, warehouse, seed, "left", aggregate=True)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    rng, history = random.Random(seed), []
    for _ in range(3):
        history.append((fact_step(up), dim.step()))
        points = rng.sample(KILLS, rng.choice([1, 1, 2]))
        kill_at_points(warehouse, raw, points)
        history.append(points)
        report = run_barrier(spark, d, tables, [0])
        assert report.v_new == up.version, history
        try:
            assert_exact(spark, d, tables)
        except AssertionError as e:
            raise AssertionError(f"after {history}: {e}") from e
