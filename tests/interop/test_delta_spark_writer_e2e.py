"""A Delta-Spark MERGE writer as the live upstream, in the default mode.

The writer is what a Structured Streaming upsert job does with each micro-batch:
``MERGE INTO delta.`upstream` t USING batch s ON t.id = s.id WHEN MATCHED AND s.op = 'D' THEN
DELETE WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED AND s.op != 'D' THEN INSERT *`` on a
table with deletion vectors and the change feed on (each batch: updates, inserts and deletes
of random keys; every MERGE writes DVs and change files). The MV is the e2e suite's (a filter
and two computed columns, tests/reliability/harness.py's mv_raw) in snapshot mode.

- e2e: barriers interleaved with MERGE batches (one per barrier, two before the first
  catch-up; the first two barriers over half the vnodes each) until the backfill finished and
  two more; after each, the platform's oracle and readers (assert_verified) and
  Delta-Spark's recompute at the recorded version (assert_mv_as_delta_spark_reads).
- the crash matrix with that writer: a reference chain and a crash chain over the same pinned
  barrier versions; the crash chain's barrier runs in a child process that SIGKILLs itself at
  a kill point (BACKFILL_TEST_KILL_AT through the harness's light child), Delta-Spark MERGEs
  the next batch while the run is down, the invariant holds on the recoverable state, the rerun
  (same pinned version) leaves tables identical to the reference's, and both oracles agree.
  CI kills in the bulk slices, inside the catch-up's merge-on-read commit (its DV file written)
  and after it, and in a later barrier; the full matrix (every boundary) is a variant.
"""

from __future__ import annotations

import random

import pytest

from backfill_assets.barrier.runner import run_barrier
from tests.interop.delta_spark import assert_mv_as_delta_spark_reads, recorded_versions
from tests.interop.spark_upstream import Features, SparkUpstream
from tests.reliability import harness as H
from tests.support import SIMPLE_COLUMNS, assert_verified, simple_row

pytestmark = pytest.mark.spark
ALL = tuple(range(H.VNODES))
HALVES = (ALL[:4], ALL[4:])


def merge_writer(spark, warehouse: str, seed: int, rows: int) -> SparkUpstream:
    """The orders upstream, created by Delta-Spark with DVs and the change feed on."""
    up = SparkUpstream(spark, f"{warehouse}/orders_delta_spark", Features(checkpoints="classic"),
                       random.Random(seed), dict(SIMPLE_COLUMNS), key="id", make_row=simple_row)
    up.create(rows)
    return up


def micro_batch(up: SparkUpstream) -> int:
    """One streaming MERGE: a few updates, inserts and deletes; the new version."""
    up.merge(updates=up.rng.randint(2, 6), inserts=up.rng.randint(1, 4),
             deletes=up.rng.randint(1, 3), op="op")
    return up.version


def test_a_delta_spark_merge_writer_as_the_live_upstream(spark, warehouse):
    up = merge_writer(spark, warehouse, seed=41, rows=120)
    raw = H.mv_raw("merged", "snapshot", 4, up.uri, slice_rows=40)
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    finished_at, checked = None, 0
    for n in range(12):
        for _ in range(2 if n == len(HALVES) else 1):  # a catch-up over two versions
            micro_batch(up)
        vnodes = HALVES[n] if n < len(HALVES) else ALL
        report = run_barrier(spark, d, tables, list(vnodes))
        checked += assert_mv_as_delta_spark_reads(spark, d, tables)
        assert_verified(spark, d, tables)
        if n >= len(HALVES) and report.finished:
            assert recorded_versions(spark, tables) == {report.v_new}
            finished_at = n if finished_at is None else finished_at
        if finished_at is not None and n - finished_at >= 2:
            break
    assert finished_at is not None, "the backfill did not finish"
    assert up.wrote_dvs(), "the MERGEs wrote no deletion vector"
    assert checked > 0


# ------------------------------------------------------------------------- crash matrix

STORAGE_KILLS = ["mv_data_files_written", "mv_change_files_written", "mv_dv_file_written"]
# barrier index -> kill points, in order, each acting on the state the previous one left:
# 0 is the bulk read committed in slices (``@n``: the n-th slice's), 1 the catch-up over
# several MERGE versions (one step: a foreign upstream's change rows are not counted per
# vnode), then change-feed barriers; 1 and later are small (the driver engine, no JVM)
CI_KILLS = {0: ["after_mv_commit@2"], 1: ["mv_dv_file_written", "after_mv_commit"],
            2: ["before_progress_commit"]}
FULL_KILLS = {0: ["after_progress_commit@1", "mv_data_files_written@1", "after_mv_commit@2",
                  "before_write@2", "before_progress_commit@2"],
              1: [*STORAGE_KILLS, "after_mv_commit", "before_progress_commit"],
              2: ["before_write", "after_mv_commit"],
              3: ["mv_dv_file_written", "before_progress_commit", "after_progress_commit"]}
BATCHES = (0, 3, 2, 2)  # MERGE batches written before each barrier (after the initial load)


def crash_matrix(spark, tmp_path, kills: dict[int, list[str]], figures) -> None:
    warehouse = str(tmp_path / "warehouse")
    up = merge_writer(spark, warehouse, seed=43, rows=240)

    def raw(name: str) -> dict:
        return H.mv_raw(name, "snapshot", 4, up.uri, slice_rows=60, catch_up_rows=1)

    ref, crash = H.Chain(spark, warehouse, raw("ref_merged")), \
        H.Chain(spark, warehouse, raw("crash_merged"))
    for i, batches in enumerate(BATCHES):
        if i not in kills and i > max(kills):
            break
        for _ in range(batches):
            micro_batch(up)
        barrier = H.Barrier(up.version)
        ref.run(barrier)
        for point in kills.get(i, []):
            what = f"barrier {i} @v{barrier.version} killed at {point}"
            child = H.light_backfill(H.light_args(warehouse, crash.raw, barrier.version,
                                                  barrier.vnodes, kill_at=point))
            assert child.killed, f"{what}: not killed (rc {child.returncode}):\n" \
                                 f"{child.output[-3000:]}"
            figures["kills_survived"] += 1
            micro_batch(up)  # the writer goes on while the run is down
            figures["rows_compared"] += H.assert_recovered_invariant(
                spark, crash.d, crash.tables, f"{what}, before the rerun")
        crash.run(barrier)  # the rerun: the same barrier (same pinned version, same vnodes)
        what = f"barrier {i} @v{barrier.version} (kills {kills.get(i, [])})"
        figures["rows_compared"] += H.assert_same_tables(ref.states[i], crash.states[-1], what)
        figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, what)
        figures["rows_compared"] += assert_mv_as_delta_spark_reads(spark, crash.d, crash.tables)
        figures["crash_scenarios"] += int(i in kills)
    assert ref.reports[0].extra["slices_planned"] >= 3 and ref.reports[0].finished
    assert ref.reports[1].forwarded_rows > 0 and ref.reports[1].engine == "driver"
    assert up.wrote_dvs(), "the MERGEs wrote no deletion vector"
    figures["mismatches"] += 0


@pytest.mark.slow
def test_crash_matrix_with_a_delta_spark_merge_writer(spark, tmp_path, figures):
    crash_matrix(spark, tmp_path, CI_KILLS, figures)


@pytest.mark.slow
@pytest.mark.variant
def test_full_crash_matrix_with_a_delta_spark_merge_writer(spark, tmp_path, figures):
    crash_matrix(spark, tmp_path, FULL_KILLS, figures)
