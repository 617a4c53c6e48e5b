"""Randomized soak: random DML, barriers, chunk sizes, rate limits, rescales and kills, with the
invariant (docs/DESIGN.md, "The invariant") checked after every commit.

Two MVs (arrangement and no_shuffle) follow one live upstream. Every round:
- 0-2 DML batches (inserts, updates, deletes, pk changes), sometimes a bulk append; a round
  without DML is an idle barrier (the same upstream version again);
- new runtime controls (controls.json, as set_controls_job writes them): chunk size 1..40, rate
  limit unlimited / paused / 20 / 200 rows/s;
- one barrier per MV at the upstream's latest version, over a random split of the vnodes
  (arrangement rescales every round; no_shuffle keeps its split until it finishes), each range
  run skipped now and then so vnodes sit at different versions;
- now and then a kill at a random commit boundary of one range run: mostly simulated in-process
  (the hook raises at the point, which leaves exactly what a SIGKILL leaves: every commit is
  atomic and nothing after the point runs), every 4th one a real SIGKILL of a child process;
  a recovery barrier over a new split follows.
The recoverable-state invariant (`harness.verify_recovered`: MV and replica) is checked at every
commit boundary the hook reports (after the replica, MV and progress commits) and after every
kill; the platform oracle (progress table only), the duplicate-key check and the progress
sanity are checked at the end of every round. A finished MV is replaced by a new one over the
same (grown) upstream, so the snapshot phase keeps being exercised.

CI runs `test_soak_short` (fixed seed, fixed number of rounds); `make soak` runs
`test_soak_long` for SOAK_SECONDS (default 1800) and prints the figures docs/RELIABILITY.md
quotes (also written to SOAK_REPORT as JSON when set).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.progress import Completed
from backfill_assets.mv.controls import Controls, write_controls
from backfill_assets.testing.kill_hook import KILL_POINTS
from backfill_assets.upstream.writer import insert_rows
from tests.reliability import harness as H

ALL = list(range(H.VNODES))
CHECKED = ("after_replica_commit", "after_mv_commit", "after_progress_commit")
CHUNKS = [1, 2, 5, 10, 40]
RATES = [None, None, None, None, None, 0, 20, 200]


class SimulatedKill(BaseException):
    """Raised by the soak's hook at a kill point: the step stops dead, like a SIGKILL."""


class Soak:
    def __init__(self, spark, warehouse: str, seed: int, real_kill_every: int = 4):
        self.spark, self.warehouse = spark, warehouse
        self.rng = random.Random(seed)
        self.real_kill_every = real_kill_every
        self.figures: Counter = Counter()
        self.live = H.orders(warehouse, seed)
        self.live.create(rows=300)
        self.gen = Counter()
        self.mvs = {mode: self._new_mv(mode) for mode in ("arrangement", "no_shuffle")}
        self.done_rounds = Counter()

    # ----------------------------------------------------------------------------- setup

    def _new_mv(self, mode: str) -> dict:
        self.gen[mode] += 1
        raw = H.mv_raw(f"soak_{mode}_{self.gen[mode]}", mode, 5, self.live.uri)
        layout = H.vnode_ranges(self.rng, ALL, max_ranges=3)
        return {"raw": raw, "d": H.definition(raw), "tables": H.tables_of(self.warehouse, raw),
                "layout": layout}

    # ------------------------------------------------------------------------------ round

    def round(self) -> None:
        self.figures["rounds"] += 1
        self._dml()
        version = H.latest(self.live.uri)
        for mode, mv in list(self.mvs.items()):
            self._barrier(mv, version)
            self._end_of_round(mode, mv)

    def _dml(self) -> None:
        for _ in range(self.rng.choice([0, 0, 1, 1, 1, 2])):
            self.live.apply(self.live.random_batch(self.rng.randint(1, 25)))
            self.figures["dml_versions"] += 1
        if self.rng.random() < 0.05:
            rows = [{"id": self.live.fresh_key(), "name": "bulk", "amount": Decimal("1.25"),
                     "qty": self.rng.randint(0, 20), "day": dt.date(2025, 5, 5)}
                    for _ in range(self.rng.randint(20, 120))]
            insert_rows(self.live.uri, pa.Table.from_pylist(rows), spec=self.live.spec)
            self.figures["dml_versions"] += 1

    def _ranges(self, mv: dict) -> list[list[int]]:
        if mv["d"].mode == "no_shuffle" and not self._finished(mv):
            return mv["layout"]
        return H.vnode_ranges(self.rng, ALL, max_ranges=4)

    def _barrier(self, mv: dict, version: int) -> None:
        tables = mv["tables"]
        write_controls(tables, Controls(self.rng.choice(CHUNKS), self.rng.choice(RATES)))
        ranges = self._ranges(mv)
        kill_at = None
        if self.rng.random() < 0.3:
            kill_at = (self.rng.randrange(len(ranges)), self.rng.choice(KILL_POINTS))
        killed = False
        for i, vnodes in enumerate(ranges):
            if self.rng.random() < 0.15 and not (kill_at and kill_at[0] == i):
                continue  # this range skips the barrier: its vnodes stay at an older version
            point = kill_at[1] if kill_at and kill_at[0] == i else None
            killed |= self._run(mv, version, vnodes, point)
        if killed:  # the rerun, over a new split (a rescale after a crash for arrangement)
            for vnodes in self._ranges(mv):
                self._run(mv, version, vnodes, None)

    def _run(self, mv: dict, version: int, vnodes: list[int], kill_point: str | None) -> bool:
        d, tables = mv["d"], mv["tables"]
        self.figures["barriers"] += 1
        if kill_point and (self.figures["kills"] + 1) % self.real_kill_every == 0:
            child = H.light_backfill(H.light_args(self.warehouse, mv["raw"], version, vnodes,
                                                  kill_at=kill_point), master="local[1]")
            assert child.killed, f"child not killed at {kill_point}: {child.output[-2000:]}"
            self.figures["kills"] += 1
            self.figures["kills_real"] += 1
            self._check(mv, f"after a real kill at {kill_point}")
            return True

        def hook(point: str) -> None:
            if point in CHECKED:
                self._check(mv, f"{d.name} {vnodes[0]}..{vnodes[-1]} @v{version} {point}")
            if point == kill_point:
                raise SimulatedKill(point)

        try:
            run_barrier(self.spark, d, tables, vnodes, version=version, hook=hook)
        except SimulatedKill:
            self.figures["kills"] += 1
            self.figures["kills_simulated"] += 1
            self._check(mv, f"after a kill at {kill_point}")
            return True
        self.figures["steps_completed"] += 1
        return False

    def _check(self, mv: dict, what: str) -> None:
        check = H.verify_recovered(self.spark, mv["d"], mv["tables"])
        self.figures["invariant_checks"] += 1
        self.figures["rows_compared"] += check.rows_compared
        if not check.ok:
            self.figures["mismatches"] += len(check.failures)
        assert check.ok, f"round {self.figures['rounds']}: {what}: invariant broken " \
                         f"(table, vnode, missing, unexpected): {check.failures[:8]}"

    def _end_of_round(self, mode: str, mv: dict) -> None:
        d, tables = mv["d"], mv["tables"]
        if H._open(tables.progress) is None:
            return
        self.figures["rows_compared"] += H.assert_oracle(self.spark, d, tables,
                                                         f"round {self.figures['rounds']}")
        state = H.snapshot(tables)
        assert state.mv_duplicates == 0, f"{d.name}: duplicate keys in the MV"
        if self._finished(mv):
            self.done_rounds[mode] += 1
            if self.done_rounds[mode] >= 3:  # a few change-feed-only barriers, then a new MV
                self.figures["backfills_finished"] += 1
                self.done_rounds[mode] = 0
                self.mvs[mode] = self._new_mv(mode)
        else:
            self.done_rounds[mode] = 0

    def _finished(self, mv: dict) -> bool:
        progress = H.recovered_progress(mv["d"], mv["tables"], ALL)
        return len(progress) == len(ALL) and all(
            isinstance(p, Completed) for p, _ in progress.values())


def run_soak(spark, tmp_path, *, rounds: int | None, seconds: float, seed: int) -> Counter:
    soak = Soak(spark, str(tmp_path / "warehouse"), seed)
    started = time.monotonic()
    deadline = started + seconds
    while (rounds is None or soak.figures["rounds"] < rounds) and time.monotonic() < deadline:
        soak.round()
        spark.catalog.clearCache()
    soak.figures["seconds"] = round(time.monotonic() - started)
    soak.figures["mismatches"] += 0
    print("SOAK FIGURES " + json.dumps(dict(sorted(soak.figures.items()))))
    path = os.environ.get("SOAK_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"seed": seed, **dict(sorted(soak.figures.items()))}, f, indent=2)
    return soak.figures


@pytest.mark.slow
@pytest.mark.variant  # a short soak: `make test-all` (and `make soak` for the long one)
@pytest.mark.spark
def test_soak_short(spark, tmp_path, figures):
    """The CI version: a fixed seed and a fixed number of rounds (SOAK_SHORT_ROUNDS)."""
    rounds = int(os.environ.get("SOAK_SHORT_ROUNDS", "10"))
    got = run_soak(spark, tmp_path, rounds=rounds, seconds=600, seed=1)
    assert got["rounds"] == rounds and got["mismatches"] == 0
    assert got["kills"] >= 1 and got["steps_completed"] > 0
    for key in ("rounds", "barriers", "kills", "invariant_checks", "rows_compared"):
        figures[f"soak_{key}"] += got[key]


@pytest.mark.soak
@pytest.mark.spark
def test_soak_long(spark, tmp_path):
    """`make soak`: rounds until SOAK_SECONDS (default 1800) have passed (SOAK_ROUNDS caps)."""
    rounds = int(os.environ["SOAK_ROUNDS"]) if os.environ.get("SOAK_ROUNDS") else None
    seconds = float(os.environ.get("SOAK_SECONDS", "1800"))
    got = run_soak(spark, tmp_path, rounds=rounds, seconds=seconds,
                   seed=int(os.environ.get("SOAK_SEED", "7")))
    assert got["mismatches"] == 0 and got["kills"] >= 1
