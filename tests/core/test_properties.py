"""Model-based property tests: random DML, barriers, runs and snapshot chunks through the core.

An in-memory upstream (dict key -> row, one snapshot per version, a change feed) and a tiny
step driver (plan_step -> replicate -> net_changes + visible -> snapshot -> apply_chunk ->
commit via the codec) run for both position strategies. After every barrier the MV must equal
a brute-force recomputation from scratch: per vnode, f(upstream@version restricted to the
vnode and key <= position), all rows once Completed. The brute force orders keys with its own
rank-based sort key, independent of ``KeyOrder.compare``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.positions import PerVnodePositions, SharedPosition
from backfill_assets.core.progress import InProgress
from tests.core.property_model import KO, UNIVERSE, VNODES, Driver, f, ref_sort_key

SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


KEYS = st.sampled_from(UNIVERSE)
DML = st.lists(
    st.tuples(st.sampled_from(["insert", "insert", "update", "delete", "move"]), KEYS, KEYS,
              st.integers(0, 9)),
    max_size=5,
)


def random_dml(data, driver: Driver) -> None:
    # bias some keys onto current positions so "key == position" happens often
    positions = [p.current_pos for p in (driver.committed(v)[0] for v in VNODES)
                 if isinstance(p, InProgress)]
    ops = data.draw(DML, label="dml")
    if positions and ops and data.draw(st.booleans(), label="hit position"):
        kind, _, key2, val = ops[0]
        ops[0] = (kind, data.draw(st.sampled_from(positions)), key2, val)
    driver.up.commit(ops)


def run_scenario(strategy, data) -> None:
    driver = Driver(strategy)
    driver.up.commit(data.draw(st.lists(st.tuples(st.just("insert"), KEYS, KEYS,
                                                  st.integers(0, 9)), max_size=25)))
    for _ in range(data.draw(st.integers(1, 6), label="runs")):
        if strategy.shared:
            run = list(VNODES)
        else:
            run = sorted(data.draw(st.sets(st.sampled_from(VNODES), min_size=1), label="run"))
        state = driver.recover(run)
        for _ in range(data.draw(st.integers(1, 3), label="barriers")):
            if data.draw(st.booleans(), label="dml?"):
                random_dml(data, driver)
            chunk_size = data.draw(st.integers(1, 4), label="chunk_size")
            rate_limit = data.draw(st.sampled_from([None, None, 0, 1, 2, 3, 7]), label="rate")
            driver.step(state, data, chunk_size, rate_limit)
    # drain: the backfill finishes, then the MV keeps up from the change feed alone
    state = driver.recover(list(VNODES))
    for _ in range(len(UNIVERSE) + 2):
        if state.is_finished():
            break
        driver.step(state, data, 4, None)
    assert state.is_finished()
    for _ in range(2):
        random_dml(data, driver)
        driver.step(state, data, 4, data.draw(st.sampled_from([None, 0])))
    assert driver.mv == f(driver.up.rows)
    assert state.snapshot_rows() == sum(driver.read_counts.values())


@SETTINGS
@given(data=st.data())
def test_arrangement_mv_matches_brute_force(data) -> None:
    run_scenario(PerVnodePositions(), data)


@SETTINGS
@given(data=st.data())
def test_no_shuffle_mv_matches_brute_force(data) -> None:
    run_scenario(SharedPosition(), data)


@settings(max_examples=300, deadline=None)
@given(a=KEYS, b=KEYS)
def test_compare_agrees_with_independent_order(a, b) -> None:
    ref = (ref_sort_key(a) > ref_sort_key(b)) - (ref_sort_key(a) < ref_sort_key(b))
    assert KO.compare(a, b) == ref
    assert sorted([a, b], key=KO.sort_key) == sorted([a, b], key=ref_sort_key)
