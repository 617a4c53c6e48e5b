"""Concurrent runs: two real backfill processes started at the same time.

The light children meet at `before_write` (a file rendezvous in the test hook): both have read
the same state and planned the same barrier before either writes, so every race below really
races. Expected:

- same vnodes, or overlapping vnodes: exactly one run fails cleanly with ConcurrentBackfillRun
  (Delta refuses its commit: the winner set the same app transaction `{mv}/{phase}/{vnode}`)
  and wrote nothing; rerunning it converges;
- disjoint vnodes: both commit.

Afterwards the tables are exactly those of the same runs done one after the other (positions
are per vnode, so the order of two runs does not matter), no key is duplicated, and the oracle
is green.
"""

from __future__ import annotations

import pytest

from tests.reliability import harness as H

ALL = tuple(range(H.VNODES))
CASES = {
    # name: (mode, vnodes of run A, vnodes of run B, expect a loser, race at the first barrier)
    # first barrier: fresh tables, replica initialisation (Spark files + one Delta append);
    # later barrier: replica merge, forwarded changes merged into the MV, snapshot chunk
    "arrangement-same": ("arrangement", ALL, ALL, True, True),
    "arrangement-overlap": ("arrangement", tuple(range(0, 6)), tuple(range(3, 8)), True, False),
    "arrangement-disjoint": ("arrangement", tuple(range(0, 4)), tuple(range(4, 8)), False, True),
    "no_shuffle-same": ("no_shuffle", ALL, ALL, True, False),
    "no_shuffle-disjoint": ("no_shuffle", tuple(range(0, 4)), tuple(range(4, 8)), False, False),
    # snapshot mode: first barrier = the bulk slice commit (appends racing on the same app
    # transactions); later barrier = catch-up forwards merged into the MV
    "snapshot-same": ("snapshot", ALL, ALL, True, True),
    "snapshot-overlap": ("snapshot", tuple(range(0, 6)), tuple(range(3, 8)), True, False),
    "snapshot-disjoint": ("snapshot", tuple(range(0, 4)), tuple(range(4, 8)), False, True),
}
CHUNK = {"arrangement": 6, "no_shuffle": 20, "snapshot": 6}

# the chunked modes' races beyond the same-vnodes one: `make test-all` (CI runs the rest)
VARIANTS = {"arrangement-overlap", "arrangement-disjoint", "no_shuffle-same",
            "no_shuffle-disjoint"}


def _race(warehouse: str, raw: dict, version: int, a: tuple, b: tuple, rdv_dir: str,
          storage_options: dict | None = None) -> dict:
    peers = ["a", "b"]
    started = {}
    for me, vnodes in (("a", a), ("b", b)):
        rdv = {"dir": rdv_dir, "me": me, "peers": peers, "point": "before_write"}
        started[me] = H.start_light(H.light_args(warehouse, raw, version, vnodes, rendezvous=rdv,
                                                 storage_options=storage_options))
    return {me: H.finish(s) for me, s in started.items()}


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.variant) if c in VARIANTS else c for c in CASES])
def test_two_runs_at_the_same_time(spark, tmp_path, case, figures):
    run_race_case(spark, str(tmp_path / "warehouse"), case, str(tmp_path), figures)


def run_race_case(spark, warehouse: str, case: str, rdv_root: str, figures,
                  storage_options: dict | None = None) -> None:
    """One case of CASES with the warehouse at ``warehouse`` (a folder, or an object-store
    URI reached with ``storage_options``: tests/reliability/test_object_store.py)."""
    mode, a, b, loser_expected, first = CASES[case]
    opts = storage_options
    live = H.orders(warehouse, seed=21, storage_options=opts)
    versions = H.prewrite(live, rows=200, batches=2, changes=10)
    ref = H.Chain(spark, warehouse, H.mv_raw(f"ref_{mode}", mode, CHUNK[mode], live.uri),
                  storage_options=opts)
    race = H.Chain(spark, warehouse, H.mv_raw(f"race_{mode}", mode, CHUNK[mode], live.uri),
                   storage_options=opts)
    if not first:
        for chain in (ref, race):
            chain.run(H.Barrier(versions[0], a))
            chain.run(H.Barrier(versions[0], b))
    for n, version in enumerate([versions[0] if first else versions[-1]]):
        ref.run(H.Barrier(version, a))
        ref.run(H.Barrier(version, b))
        results = _race(warehouse, race.raw, version, a, b, f"{rdv_root}/rdv{n}", opts)
        errors = {me: r.error for me, r in results.items()}
        for me, r in results.items():
            assert r.returncode in (0, 3) and r.result is not None, r.output[-3000:]
            assert r.error in (None, "ConcurrentBackfillRun"), f"{me}: {str(r.result)[:800]}"
        losers = [me for me, e in errors.items() if e]
        if loser_expected:
            assert len(losers) == 1, f"{case}: expected exactly one loser, got {errors}"
            message = results[losers[0]].result["message"]
            assert "rerun" in message and "disjoint vnode ranges" in message, message
        else:
            assert not losers, f"{case}: disjoint runs must both commit, got " \
                f"{ {me: str(r.result)[:400] for me, r in results.items()} }"
        for me in losers:  # the loser wrote nothing of its step: rerunning it converges
            race.run(H.Barrier(version, a if me == "a" else b))
        figures["concurrent_runs"] += 2
        figures["concurrent_losers_rerun"] += len(losers)
        now = H.snapshot(race.tables)
        figures["rows_compared"] += H.assert_same_tables(ref.states[-1], now, f"{case} race {n}")
        figures["rows_compared"] += H.assert_oracle(spark, race.d, race.tables, case)
    figures["concurrency_scenarios"] += 1


@pytest.mark.slow
@pytest.mark.spark
def test_two_dagster_runs_same_range(spark, tmp_path, figures):
    """The real wiring, no rendezvous: two `dagster job execute` of the same barrier started
    together. Whatever the interleaving, each run succeeds or fails with ConcurrentBackfillRun,
    and after rerunning a loser the tables equal two sequential barriers."""
    import threading

    warehouse = str(tmp_path / "warehouse")
    home = H.init_dagster_home(str(tmp_path / "dagster_home"))
    live = H.orders(warehouse, seed=22)
    versions = H.prewrite(live, rows=200, batches=1, changes=10)
    ref = H.Chain(spark, warehouse, H.mv_raw("ref_dg", "arrangement", 6, live.uri))
    race = H.Chain(spark, warehouse, H.mv_raw("race_dg", "arrangement", 6, live.uri))
    for version in versions:  # a first barrier, then the race at the next one
        ref.run(H.Barrier(version))
    race.run(H.Barrier(versions[0]))
    ref.run(H.Barrier(versions[-1]))
    results: dict = {}

    def go(me: str) -> None:
        results[me] = H.dagster_backfill(warehouse, home, race.raw, versions[-1], ALL,
                                         master="local[1]")

    threads = [threading.Thread(target=go, args=(me,)) for me in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for me, r in results.items():
        if r.returncode != 0:
            assert "ConcurrentBackfillRun" in r.output, f"{me}: {r.output[-3000:]}"
            race.run(H.Barrier(versions[-1]))
            figures["concurrent_losers_rerun"] += 1
    figures["concurrent_runs"] += 2
    race_state = H.snapshot(race.tables)  # two steps at the barrier either way
    figures["rows_compared"] += H.assert_same_tables(ref.states[-1], race_state, "dagster race")
    figures["rows_compared"] += H.assert_oracle(spark, race.d, race.tables, "dagster race")
    figures["concurrency_scenarios"] += 1
