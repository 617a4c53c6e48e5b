"""Crashes and races with every table on an S3-compatible server (moto, on loopback).

The local-folder suites (test_crash_matrix.py, test_concurrency.py) kill a real process at
every commit boundary and race two real runs. The commit protocol they exercise is the same code
on S3, but the bytes are not: on an object store the data files, change files and deletion
vectors are objects PUT by Spark tasks, and a version exists only once its log entry won the
create-only PUT (``If-None-Match: *``). So this file runs, against the moto server:

- a crash chain in snapshot mode (the default), SIGKILLed at the kill points that leave objects
  behind without a log entry or a log entry without progress: mv_data_files_written (the bulk
  slice's files uploaded), after_mv_commit (slice committed, progress not), and in catch-up
  barriers mv_change_files_written, mv_dv_file_written (data, change and DV objects uploaded)
  and before_progress_commit. Before each rerun: the table versions did not move past the kill
  point, the uploaded objects are really on the store, and the recoverable state satisfies the
  invariant; after it: the tables equal an uninterrupted reference chain and the oracle is green.
  The kill points before any object is written (before_write, after_replica_commit,
  after_progress_commit) behave the same on every store and stay in the local matrix.
- the same kill at mv_data_files_written with the child's Spark on the standalone cluster: there
  the files were uploaded by executors in other JVMs, not by the process that died.
- two runs over the same vnodes at the first barrier (snapshot mode: both create the tables and
  race for the bulk commit) and over overlapping vnodes at a later barrier (arrangement: replica
  and MV merges): exactly one fails with ConcurrentBackfillRun; after its rerun nothing is
  lost or duplicated.
- a store that ignores conditional writes is refused by name before a barrier writes anything.
"""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import ConditionalWritesUnsupported
from backfill_assets.storage import objects
from tests.infra.s3_proxy import start_proxy
from tests.reliability import harness as H
from tests.reliability.test_concurrency import run_race_case

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.cluster]

# barrier index -> kill points, one after the other, each on the state the previous one left
KILLS = {0: ["mv_data_files_written", "after_mv_commit"],  # the bulk slice
         1: ["mv_change_files_written"],  # catch-up over versions 1..2
         2: ["mv_dv_file_written"],
         3: ["before_progress_commit"]}
UPLOADS = {"mv_data_files_written", "mv_change_files_written", "mv_dv_file_written"}
CLUSTER_CONF = '{"spark.executor.memory": "1g", "spark.driver.memory": "1g"}'


def _objects_under(uri: str, opts: dict) -> int:
    return len(objects.list_prefix(uri, opts))


def _script(versions: list[int]) -> list[H.Barrier]:
    """The bulk read at v0, a catch-up barrier coalescing v1..v2, then v3 and v4."""
    return [H.Barrier(versions[0]), H.Barrier(versions[2]), H.Barrier(versions[3]),
            H.Barrier(versions[4])]


def _crash_chain(spark, warehouse: str, opts: dict, kills: dict, figures,
                 master: str = "local[2]", extra_env: dict | None = None) -> None:
    live = H.orders(warehouse, seed=31, storage_options=opts)
    versions = H.prewrite(live, rows=160, batches=4, changes=12)
    script = _script(versions)

    def raw(name: str) -> dict:
        return H.mv_raw(name, "snapshot", 4, live.uri)

    ref = H.Chain(spark, warehouse, raw("ref_s3"), storage_options=opts)
    for barrier in script:
        ref.run(barrier)
    assert ref.reports[0].finished and all(r.forwarded_rows > 0 for r in ref.reports[1:])
    crash = H.Chain(spark, warehouse, raw("crash_s3"), storage_options=opts)
    for i, barrier in enumerate(script):
        for point in kills.get(i, []):
            what = f"S3 barrier {i} @v{barrier.version} killed at {point} ({master})"
            before = H.table_versions(crash.tables)
            uploaded = _objects_under(crash.tables.mv, opts)
            args = H.light_args(warehouse, crash.raw, barrier.version, barrier.vnodes,
                                kill_at=point, storage_options=opts)
            child = H.light_backfill(args, master=master, extra_env=extra_env)
            assert child.killed, f"{what}: not SIGKILLed (rc {child.returncode}):\n" \
                                 f"{child.output[-3000:]}"
            figures["kills_survived_s3"] += 1
            after = H.table_versions(crash.tables)
            if point in UPLOADS:  # objects on the store, no log entry: invisible
                assert after["mv"] == before["mv"] or before["mv"] is None and after["mv"] == 1, \
                    f"{what}: the MV moved {before} -> {after}"
                assert _objects_under(crash.tables.mv, opts) > uploaded, \
                    f"{what}: nothing was uploaded before the kill"
            else:  # after_mv_commit / before_progress_commit: the MV commit landed
                assert after["mv"] != before["mv"], f"{what}: no MV commit {before} -> {after}"
            assert after["progress"] == before["progress"] or before["progress"] is None, \
                f"{what}: progress committed {before} -> {after}"
            figures["rows_compared"] += H.assert_recovered_invariant(
                spark, crash.d, crash.tables, f"{what}, before the rerun")
        crash.run(barrier)  # the rerun: the same barrier (same version, same vnodes)
        what = f"S3 barrier {i} @v{barrier.version}"
        figures["rows_compared"] += H.assert_same_tables(ref.states[i], crash.states[-1], what)
        figures["rows_compared"] += H.assert_oracle(spark, crash.d, crash.tables, what)
        figures["crash_scenarios_s3"] += 1
    figures["mismatches"] += 0


def test_kills_at_the_commit_boundaries_on_s3(spark, s3_server, figures):
    _crash_chain(spark, s3_server.fresh_uri("crash"), dict(s3_server.storage_options), KILLS,
                 figures)


def test_kill_after_executors_uploaded_on_the_cluster(spark, s3_server, spark_cluster, figures):
    """The driver dies after the executors (other JVMs) uploaded the bulk slice's files."""
    _crash_chain(spark, s3_server.fresh_uri("crash-cluster"), dict(s3_server.storage_options),
                 {0: ["mv_data_files_written"]}, figures, master=spark_cluster.master_url,
                 extra_env={"BACKFILL_SPARK_CONF": CLUSTER_CONF})


@pytest.mark.parametrize("case", [
    "snapshot-same", pytest.param("arrangement-overlap", marks=pytest.mark.variant)])
def test_two_runs_at_the_same_time_on_s3(spark, s3_server, tmp_path, case, figures):
    run_race_case(spark, s3_server.fresh_uri("race"), case, str(tmp_path), figures,
                  storage_options=dict(s3_server.storage_options))


def test_barrier_refused_on_a_store_without_conditional_writes(spark, s3_server):
    """The same bucket behind a proxy that drops If-None-Match (what a store without
    conditional writes does): the barrier fails by name and writes nothing."""
    opts = dict(s3_server.storage_options)
    warehouse = s3_server.fresh_uri("unsafe")
    live = H.orders(warehouse, seed=41, storage_options=opts)
    H.prewrite(live, rows=40, batches=0, changes=0)  # the upstream, on the real store
    proxy = start_proxy(s3_server.endpoint)
    try:
        unsafe = proxy.storage_options(opts)
        chain = H.Chain(spark, warehouse, H.mv_raw("unsafe_mv", "snapshot", 4, live.uri),
                        storage_options=unsafe)
        with pytest.raises(ConditionalWritesUnsupported, match="If-None-Match"):
            chain.run(H.Barrier(H.latest(live.uri, opts)))
    finally:
        proxy.stop()
    names = {o.uri[len(warehouse) + 1:].split("/", 1)[0]
             for o in objects.list_prefix(warehouse, opts)}
    assert names == {"orders"}, f"a refused barrier wrote {names - {'orders'}}"
