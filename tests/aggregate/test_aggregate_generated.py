"""Aggregate MVs drawn by Hypothesis (group keys, filter, aggregates; the upstream's column
mapping, deletion vectors and checkpoints) over a Delta-Spark upstream under random DML with
the edges the algebra must keep (tests/aggregate/generated.py): after every barrier the MV
equals Spark's GROUP BY at the recorded version, by both oracles (the platform's
verify_aggregate over delta-rs' read of the upstream, and Delta-Spark's own read of the
upstream and of the MV), and every reader agrees with the MV and its change feed replays.

The default run is one drawn example in snapshot mode; the variant runs more examples and the
arrangement and no_shuffle backfills (small chunks, so barriers land while vnodes are
unfinished)."""

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
from tests.reliability import harness as H

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
# no shrinking: each example is a Spark run; a failure names its seed and whole history
PHASES = [Phase.explicit, Phase.generate]
EXAMPLES = itertools.count()  # a fresh folder per example: Hypothesis reruns a failing seed


def run_history(spark, warehouse: str, seed: int, mode: str, barriers: int) -> None:
    """One drawn MV and upstream, ``barriers`` barriers of random DML, both oracles after
    each (the Delta-Spark one once every vnode is at one version)."""
    rng, n = random.Random(seed), next(EXAMPLES)
    up = generated_upstream(spark, f"{warehouse}/up_{n}", seed, rows=60)
    raw = generated_raw(f"gen_{n}_{mode}", up.uri, seed, mode=mode,
                        **({"chunk_size": 9} if mode != "snapshot" else {}))
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    history: list = [raw["group_by"], raw.get("filter"), sorted(raw["aggregates"])]
    finished = False
    for n in range(barriers):
        if n:
            history.append(random_step(up, rng))
        report = run_barrier(spark, d, tables, list(range(d.vnode_count)))
        what = f"barrier {n} of {history}"
        try:
            assert_exact(spark, d, tables)
            finished = finished or report.finished
            if finished:
                assert_as_delta_spark_groups(spark, d, up.uri, tables.mv, tables)
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from e
    assert finished, f"the backfill did not finish in {barriers} barriers"


@settings(max_examples=1, deadline=None, derandomize=True, suppress_health_check=SLOW,
          phases=PHASES)
@given(seed=st.integers(0, 2**31))
def test_a_drawn_aggregate_mv_equals_both_oracles_after_every_barrier(spark, warehouse, seed):
    run_history(spark, warehouse, seed, "snapshot", barriers=5)


@pytest.mark.variant
@pytest.mark.parametrize("mode", ["snapshot", "arrangement", "no_shuffle"])
@settings(max_examples=4, deadline=None, suppress_health_check=SLOW, phases=PHASES)
@given(seed=st.integers(0, 2**31))
def test_drawn_aggregate_mvs_in_every_mode(spark, warehouse, mode, seed):
    run_history(spark, warehouse, seed, mode, barriers=12)
