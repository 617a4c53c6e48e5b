"""Crash matrix: SIGKILL a real backfill process at every commit boundary of a step.

One reference chain (in-process, never killed) and one crash chain run the same MV definition
over the same pre-written upstream with the same pinned barrier script. At each barrier of the
script that is marked with a kill point, the crash chain runs that barrier in a child process
(`dagster job execute -j backfill_job` for arrangement: the real wiring; the light child for
no_shuffle) that SIGKILLs itself at the point (`BACKFILL_TEST_KILL_AT`). Then:

1. the crash state: nothing beyond the boundary was written (Delta versions and rows), and the
   invariant (docs/DESIGN.md, "The invariant") holds on the recoverable state;
2. the rerun (the same barrier again, unless the kill came after its progress commit: then the
   barrier was complete and the chain moves on, as the barrier sensor would);
3. after the rerun the tables are identical to the reference after that barrier: MV rows (all
   columns, as a multiset), progress rows, no duplicate key; the oracle is green;
4. the chain goes on to the end; the final tables are identical and verify_job is green.
"""

from __future__ import annotations

import pytest

from tests.reliability import harness as H

SNAPSHOT_KILLS = ["before_write", "after_replica_commit", "after_mv_commit",
                  "before_progress_commit", "after_progress_commit"]
IDLE_KILL = "after_mv_commit"  # on a second barrier at the same upstream version
# inside the MV's merge-on-read commit: after its data files, its change files, its DV file
STORAGE_KILLS = ["mv_data_files_written", "mv_change_files_written", "mv_dv_file_written"]
CDF_ONLY_KILLS = [*STORAGE_KILLS, "after_mv_commit", "before_progress_commit"]
CHUNK = {"arrangement": 4, "no_shuffle": 32}  # per vnode / in total: ~8 snapshot barriers


def _script(versions: list[int]) -> list[H.Barrier]:
    """v1..v5, v5 again (an idle barrier: the upstream did not move), v6..v_last."""
    return [H.Barrier(v) for v in versions[:5]] + [H.Barrier(versions[4])] + \
        [H.Barrier(v) for v in versions[5:]]


def _kill_plan(mode: str, ref: H.Chain) -> dict[int, tuple[str, str]]:
    """barrier index -> (kill point, phase); change-feed-only kills go on barriers after
    every vnode finished that forward changes (so the MV commit is not empty)."""
    kills = SNAPSHOT_KILLS if mode == "arrangement" else \
        [p for p in SNAPSHOT_KILLS if p != "after_replica_commit"]  # no replica in no_shuffle
    plan = {i: (p, "snapshot") for i, p in enumerate(kills)}
    plan[5] = (IDLE_KILL, "snapshot, idle barrier (same version)")
    finished = next(i for i, r in enumerate(ref.reports) if r.finished)
    assert finished > 5, "the snapshot phase must outlast the snapshot kills"
    cdf = [i for i, r in enumerate(ref.reports) if i > finished and r.forwarded_rows > 0]
    assert len(cdf) >= len(CDF_ONLY_KILLS), "too few change-feed-only barriers with changes"
    for i, point in zip(cdf, CDF_ONLY_KILLS, strict=False):
        plan[i] = (point, "change-feed only")
    for i, (point, _) in plan.items():
        if point in ("after_mv_commit", "before_progress_commit"):
            before = ref.states[i - 1].versions["mv"] if i else None
            assert ref.states[i].versions["mv"] != before, f"barrier {i} makes no MV commit"
    return plan


def _crash_state_ok(point: str, pre: H.TableState, post: H.TableState, ref: H.TableState,
                    mode: str) -> None:
    """What a kill at `point` may have left behind: exactly the commits before it."""
    v0, v1 = pre.versions, post.versions

    def same(name: str) -> bool:
        # created empty: version 0, or 1 for a merge-on-read table (its DV feature commit)
        return v1[name] == v0[name] or (v0[name] is None and v1[name] in (0, 1))

    if point == "before_write":
        assert all(same(t) for t in v1), f"{point}: something was written {v0} -> {v1}"
        assert post.mv == pre.mv and post.progress == pre.progress
    elif point in STORAGE_KILLS:  # files written, no log entry: invisible
        assert same("mv") and same("progress"), f"{point}: MV/progress written {v0} -> {v1}"
        assert post.mv == pre.mv and post.progress == pre.progress
    elif point == "after_replica_commit":
        assert same("mv") and same("progress"), f"{point}: MV/progress written {v0} -> {v1}"
        assert post.mv == pre.mv and post.progress == pre.progress
        if mode == "arrangement":
            assert v1["replica"] != v0["replica"], f"{point}: the replica commit is missing"
    elif point in ("after_mv_commit", "before_progress_commit"):
        assert same("progress") and post.progress == pre.progress, f"{point}: progress written"
        assert post.mv == ref.mv, f"{point}: the MV commit is not the reference's"
    else:  # after_progress_commit: the barrier is complete
        assert post.mv == ref.mv and post.progress == ref.progress


def _kill(warehouse: str, dagster_home: str | None, raw: dict, barrier: H.Barrier, point: str,
          what: str) -> None:
    """Run `barrier` in a child that SIGKILLs itself at `point`: `dagster job execute` (the
    real wiring) when a Dagster home is given, else the light child."""
    if dagster_home:
        child = H.dagster_backfill(warehouse, dagster_home, raw, barrier.version,
                                   barrier.vnodes, kill_at=point)
    else:
        child = H.light_backfill(H.light_args(warehouse, raw, barrier.version, barrier.vnodes,
                                              kill_at=point))
    assert child.killed, f"{what}: child was not SIGKILLed (rc {child.returncode}):\n" \
                         f"{child.output[-3000:]}"


EMPTY = H.TableState(H.Counter(), (), {"mv": None, "replica": None, "progress": None}, 0)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.variant  # CI runs the default mode's crash matrix (snapshot, below)
@pytest.mark.parametrize("mode", ["arrangement", "no_shuffle"])
def test_kill_at_every_commit_boundary(spark, tmp_path, mode, figures):
    warehouse, dagster_home = str(tmp_path / "warehouse"), str(tmp_path / "dagster_home")
    live = H.orders(warehouse, seed=11)
    versions = H.prewrite(live, rows=240, batches=16, changes=12)
    script = _script(versions)
    ref = H.Chain(spark, warehouse, H.mv_raw(f"ref_{mode}", mode, CHUNK[mode], live.uri))
    for barrier in script:
        ref.run(barrier)
    H.assert_oracle(spark, ref.d, ref.tables, "reference")
    plan = _kill_plan(mode, ref)

    crash = H.Chain(spark, warehouse, H.mv_raw(f"crash_{mode}", mode, CHUNK[mode], live.uri))
    for i, barrier in enumerate(script):
        if i not in plan:
            crash.run(barrier)
            figures["rows_compared"] += H.assert_same_tables(ref.states[i], crash.states[-1],
                                                             f"barrier {i}")
            continue
        point, phase = plan[i]
        what = f"{mode} barrier {i} @v{barrier.version} ({phase}) killed at {point}"
        pre = crash.states[-1] if crash.states else EMPTY
        _kill(warehouse, dagster_home if mode == "arrangement" else None, crash.raw, barrier,
              point, what)
        figures["kills_survived"] += 1
        post = H.snapshot(crash.tables)
        _crash_state_ok(point, pre, post, ref.states[i], mode)
        figures["rows_compared"] += H.assert_recovered_invariant(spark, crash.d, crash.tables,
                                                                 f"{what}, before the rerun")
        if point == "after_progress_commit":
            crash.states.append(post)  # complete: the next barrier is the next one
        else:
            crash.run(barrier)  # the rerun: the same barrier (same version, same vnodes)
        figures["rows_compared"] += H.assert_same_tables(ref.states[i], crash.states[-1], what)
        figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, what)
        figures["crash_scenarios"] += 1
    figures["rows_compared"] += H.assert_same_tables(ref.states[-1], crash.states[-1], "end")
    figures["rows_compared"] += H.run_verify_job(crash.d, warehouse)
    figures["mismatches"] += 0


# Snapshot mode: 240 rows over 8 vnodes in slices of ~60 rows (3-5 slices). A barrier is a
# forward step over the finished vnodes (none at first) and one step per slice, so `@n` counts
# the kill point over those steps. Kills follow each other in the first barrier, each on the
# state the previous one left: between slices 1 and 2, inside slice 2's MV commit (its data
# files written, no log entry), inside slice 2 (MV committed, progress not), before slice 3
# writes, inside slice 3; then in the catch-up barrier that coalesces six versions (inside its
# merge-on-read commit too: after the data files, the change files, before the log entry), on
# the idle barrier after it, and on a later change-feed barrier. The catch-up runs one step
# per vnode (`catch_up_rows` 1, below any vnode's change rows), so kills also fall between
# its steps and inside a later one.
SLICE_ROWS = 60
CATCH_UP_ROWS = 1
SLICE_KILLS = {0: ["after_progress_commit@1", "mv_data_files_written@1", "after_mv_commit@2",
                   "before_write@2", "before_progress_commit@2"],
               # catch-up and later barriers are small (driver engine): kills inside its
               # first step's commit, then between its steps and inside a later one
               1: [*STORAGE_KILLS, "after_mv_commit", "after_progress_commit@2",
                   "after_mv_commit@2"], 2: ["after_mv_commit"],
               3: ["mv_dv_file_written", "before_progress_commit"]}


# The kills of one barrier depend on each other (each acts on the state the previous one left),
# the barriers' kill sets do not: three cases, so two test workers share the matrix. Each case
# drives the whole script and checks every barrier against the reference.
KILL_CASES = {"slices": (0,), "catch_up": (1,), "after_catch_up": (2, 3)}
assert sorted(i for case in KILL_CASES.values() for i in case) == sorted(SLICE_KILLS), \
    "every barrier with kills belongs to exactly one case"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("case", list(KILL_CASES))
def test_snapshot_mode_kills_inside_and_between_slices_and_in_catch_up(spark, tmp_path, case,
                                                                       figures):
    warehouse, dagster_home = str(tmp_path / "warehouse"), str(tmp_path / "dagster_home")
    live = H.orders(warehouse, seed=12)
    versions = H.prewrite(live, rows=240, batches=10, changes=12)
    script = [H.Barrier(versions[0]), H.Barrier(versions[6]), H.Barrier(versions[6]),
              *[H.Barrier(v) for v in versions[7:]]]

    def raw(name: str) -> dict:
        return H.mv_raw(name, "snapshot", 4, live.uri, slice_rows=SLICE_ROWS,
                        catch_up_rows=CATCH_UP_ROWS)

    ref = H.Chain(spark, warehouse, raw("ref_snapshot"))
    for barrier in script:
        ref.run(barrier)
    assert ref.reports[0].extra["slices_planned"] >= 3 and ref.reports[0].finished
    assert ref.reports[1].forwarded_rows > 0, "the catch-up barrier forwards nothing"
    assert ref.reports[1].extra["catch_up_steps"] >= 4  # kills between and inside its steps
    assert ref.reports[1].engine == ref.reports[3].engine == "driver"  # small barriers
    H.assert_oracle(spark, ref.d, ref.tables, "reference")
    crash = H.Chain(spark, warehouse, raw("crash_snapshot"))
    for i, barrier in enumerate(script):
        done = []  # vnodes Completed in the recoverable state after each kill of barrier 0
        for n, point in enumerate(SLICE_KILLS[i] if i in KILL_CASES[case] else []):
            what = f"snapshot barrier {i} @v{barrier.version} killed at {point}"
            real = dagster_home if i == 0 and n == 0 else None  # the real wiring once
            _kill(warehouse, real, crash.raw, barrier, point, what)
            figures["kills_survived"] += 1
            figures["rows_compared"] += H.assert_recovered_invariant(
                spark, crash.d, crash.tables, f"{what}, before the rerun")
            if i == 0:
                done.append(len(H.recovered_progress(crash.d, crash.tables, barrier.vnodes)))
        if done:  # a kill loses at most the slice in flight
            assert 0 < done[0] == done[1] < done[2] == done[3] < 8 and done[4] > done[3], done
        crash.run(barrier)  # the rerun: the same barrier (same version, same vnodes)
        what = f"snapshot barrier {i} @v{barrier.version}"
        figures["rows_compared"] += H.assert_same_tables(ref.states[i], crash.states[-1], what)
        figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, what)
        figures["crash_scenarios"] += int(i in KILL_CASES[case])
    figures["rows_compared"] += H.run_verify_job(crash.d, warehouse)
    figures["mismatches"] += 0
