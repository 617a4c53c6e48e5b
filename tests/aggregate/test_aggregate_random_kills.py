"""Kills at drawn commit points of drawn barriers on the aggregate path: a drawn aggregate MV
over a Delta-Spark upstream (tests/aggregate/generated.py), each barrier of random DML first
run in a real child process SIGKILLed at a drawn point of the crash matrix (sometimes twice in
a row: the recovery killed as well), then finished in this process; the MV equals Spark's
GROUP BY by both oracles after each, never a row lost or counted twice. Variants (CI time:
the fixed crash matrix, tests/aggregate/test_aggregate_kills.py, is the default run's): one
history in snapshot mode, and more, in arrangement mode too."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from backfill_assets.barrier.runner import run_barrier
from tests.aggregate.generated import (
    assert_as_delta_spark_groups,
    generated_raw,
    generated_upstream,
    random_step,
)
from tests.aggregate.test_aggregate_barriers import assert_exact
from tests.aggregate.test_aggregate_kills import APPLY_KILLS
from tests.reliability import harness as H
from tests.reliability.drawn_kills import kill_at_points

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SETTINGS = {"deadline": None, "phases": [Phase.explicit, Phase.generate],
            "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
EXAMPLES = itertools.count()
KILLS = [p for p in APPLY_KILLS if p != "before_write"]


def killed_history(spark, warehouse: str, seed: int, mode: str, barriers: int) -> None:
    rng, n = random.Random(seed), next(EXAMPLES)
    up = generated_upstream(spark, f"{warehouse}/kup_{n}", seed, rows=50)
    raw = generated_raw(f"kgen_{n}", up.uri, seed, mode=mode,
                        **({"chunk_size": 15} if mode != "snapshot" else {}))
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, [0])
    history: list = [raw["group_by"], sorted(raw["aggregates"])]
    for _ in range(barriers):
        history.append(random_step(up, rng))
        points = rng.sample(KILLS, rng.choice([1, 1, 2]))
        kill_at_points(warehouse, raw, points)
        history.append(points)
        report = run_barrier(spark, d, tables, [0])
        try:
            assert_exact(spark, d, tables)
            if report.finished:
                assert_as_delta_spark_groups(spark, d, up.uri, tables.mv, tables)
        except AssertionError as e:
            raise AssertionError(f"after {history}: {e}") from e


@pytest.mark.variant
@settings(max_examples=1, derandomize=True, **SETTINGS)
@given(seed=st.integers(0, 2**31))
def test_kills_at_drawn_points_neither_lose_nor_double_count(spark, warehouse, seed):
    killed_history(spark, warehouse, seed, "snapshot", barriers=3)


@pytest.mark.variant
@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
@settings(max_examples=3, **SETTINGS)
@given(seed=st.integers(0, 2**31))
def test_more_kills_at_drawn_points(spark, warehouse, mode, seed):
    killed_history(spark, warehouse, seed, mode, barriers=5)
