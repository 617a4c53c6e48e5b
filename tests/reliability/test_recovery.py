"""Crash cases pinned in-process (fast), plus the kill hook's contract. Each is a way the
recovery could go wrong that the crash matrix can reach:

- An idle barrier (the upstream did not move: the same version again) killed after its MV
  commit must not be recovered as "nothing to recover" (the MV's app-transaction version equals
  the progress table's): the rerun would append the same snapshot chunk again, duplicates.
- A change-feed-only barrier killed between its MV and progress commits must not leave the
  progress table behind when rerun at the same version (nothing moves, so nothing is written):
  the oracle (and verify_job) would then compare the MV against an older upstream version.
- A rerun of a barrier killed between its commits must complete that barrier, not read one
  more snapshot chunk, so that crash + rerun gives the tables of a run without the crash.

The kill here is the hook raising at the point (what a SIGKILL leaves behind: the commits made
so far); test_crash_matrix.py does the same with real SIGKILLs of child processes.
"""

from __future__ import annotations

import pytest

from backfill_assets.step import loop
from backfill_assets.testing.kill_hook import kill_hook
from tests.reliability import harness as H


class Killed(BaseException):
    pass


def _kill_at(point: str):
    def hook(reached: str) -> None:
        if reached == point:
            raise Killed(point)

    return hook


def _chains(spark, warehouse: str, mode: str, chunk: int):
    live = H.orders(warehouse, seed=41)
    versions = H.prewrite(live, rows=120, batches=6, changes=8)
    ref = H.Chain(spark, warehouse, H.mv_raw(f"ref_{mode}", mode, chunk, live.uri))
    crash = H.Chain(spark, warehouse, H.mv_raw(f"crash_{mode}", mode, chunk, live.uri))
    return versions, ref, crash


def _killed_then_rerun(chain: H.Chain, barrier: H.Barrier, point: str) -> None:
    with pytest.raises(Killed):
        chain.run(barrier, hook=_kill_at(point))
    chain.run(barrier)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["arrangement", "no_shuffle"])
def test_idle_barrier_killed_after_its_mv_commit(spark, warehouse, mode, figures):
    chunk = {"arrangement": 3, "no_shuffle": 20}[mode]
    versions, ref, crash = _chains(spark, warehouse, mode, chunk)
    script = [H.Barrier(versions[0]), H.Barrier(versions[0]), H.Barrier(versions[1])]
    for b in script:
        ref.run(b)
    crash.run(script[0])
    _killed_then_rerun(crash, script[1], "after_mv_commit")  # same version as the one before
    H.assert_same_tables(ref.states[1], crash.states[-1], "idle barrier rerun")
    crash.run(script[2])
    figures["rows_compared"] += H.assert_same_tables(ref.states[2], crash.states[-1], "next")
    figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, "idle barrier")


@pytest.mark.spark
@pytest.mark.parametrize("point", ["after_mv_commit", "before_progress_commit"])
def test_change_feed_only_barrier_killed_before_its_progress_commit(spark, warehouse, point,
                                                                    figures):
    versions, ref, crash = _chains(spark, warehouse, "arrangement", 1000)  # one chunk: done
    for chain in (ref, crash):
        chain.run(H.Barrier(versions[0]))
        assert chain.reports[-1].finished
    ref.run(H.Barrier(versions[1]))
    assert ref.reports[-1].forwarded_rows > 0
    _killed_then_rerun(crash, H.Barrier(versions[1]), point)
    figures["rows_compared"] += H.assert_same_tables(ref.states[-1], crash.states[-1], point)
    figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, point)


def test_kill_hook_is_free_unless_asked_for():
    """Production passes `no_hook` (one no-op call per boundary); BACKFILL_TEST_KILL_AT selects
    a point and the n-th time it is reached, and the process dies by SIGKILL right there."""
    import subprocess
    import sys

    from resources.settings import load_settings

    assert kill_hook(None) is loop.no_hook
    assert kill_hook(load_settings({}).test_kill_at) is loop.no_hook
    with pytest.raises(ValueError, match="unknown kill point"):
        kill_hook("somewhere")
    code = ("from backfill_assets.testing.kill_hook import KILL_POINTS, kill_hook\n"
            "from resources.settings import load_settings\n"
            "hook = kill_hook(load_settings().test_kill_at)\n"
            "for p in KILL_POINTS: hook(p)\n"
            "print('survived the first', flush=True)\n"
            "hook('after_mv_commit')\n"
            "print('not reached')\n")
    env = {**H.child_env("/tmp"), "BACKFILL_TEST_KILL_AT": "after_mv_commit@2"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=H.ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.split() == ["survived", "the", "first"]


class _Killed(Exception):
    """Stands for the SIGKILL of the crash matrix: raised at the commit boundary."""


def _finished(chain: H.Chain) -> int:
    from backfill_assets.core.progress import Completed

    progress = H.recovered_progress(chain.d, chain.tables, range(H.VNODES))
    return sum(1 for p, _ in progress.values() if isinstance(p, Completed))


@pytest.mark.spark
def test_idle_barrier_killed_after_its_mv_commit_replays_with_finished_vnodes(spark, tmp_path):
    """Arrangement at one upstream version, barrier after barrier: once some vnodes have
    finished, a barrier killed after its MV commit and run again must end where the
    uninterrupted barrier ends, not one chunk further."""
    warehouse = str(tmp_path / "warehouse")
    live = H.orders(warehouse, seed=11)
    barrier = H.Barrier(H.prewrite(live, rows=240, batches=0, changes=0)[0])
    ref = H.Chain(spark, warehouse, H.mv_raw("ref_idle", "arrangement", 4, live.uri))
    crash = H.Chain(spark, warehouse, H.mv_raw("crash_idle", "arrangement", 4, live.uri))
    while not 0 < _finished(ref) < H.VNODES:  # the barrier before has finished some vnodes
        assert not ref.run(barrier).finished, "no barrier left some vnodes unfinished"
        crash.run(barrier)
    ref.run(barrier)

    def kill(point: str) -> None:
        if point == "after_mv_commit":
            raise _Killed(point)

    with pytest.raises(_Killed):
        crash.run(barrier, hook=kill)
    crash.run(barrier)  # the rerun: the same barrier
    H.assert_same_tables(ref.states[-1], crash.states[-1], "idle barrier rerun")
    H.assert_oracle(spark, crash.d, crash.tables, "idle barrier rerun")
