"""One follower run serving a folder of MVs (`follower_job` with `mv: all`), for real: a chain
and a sibling over one upstream and an MV over another, exact against the oracle after the
writer's commits; one MV failing (its upstream loses a column it reads) leaves the pool with
its error named in its records while the others keep following; one MV stopped on request
stops alone; liveness sees each MV followed exactly while the pool serves it."""

from __future__ import annotations

import threading

import dagster as dg
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from backfill_assets.barrier.follower import request_stop
from backfill_assets.definitions import build_definitions
from backfill_assets.mv.owned_tables import read_rows
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.verify.oracle import verify
from backfill_assets.wiring.liveness import FAILED_TAG, FOLLOWS_TAG, mvs_in_flight
from resources.catalog import load_catalog
from resources.mv import mv_tables
from resources.settings import load_settings
from tests.support import caught_up, progress_rows, wait_for

VNODES = 4
BASE = {"upstream": "upstream", "primary_key": ["id"], "columns": ["id", "region", "qty"],
        "vnode_count": VNODES, "chunk_size": 5000}
MVS = {
    "a.yaml": {**BASE, "filter": "qty > 0"},
    "b.yaml": {**BASE, "upstream": "a/downstream_mv", "filter": "qty > 2", "mode": "no_shuffle"},
    "c.yaml": {**BASE, "filter": "qty > 5", "mode": "arrangement"},
    "e.yaml": {**BASE, "upstream": "other"},
}


def _commit(warehouse: str, table: str, seed: int) -> int:
    run_load(f"{warehouse}/{table}", LoadParams(seed=seed, initial_rows=300, versions=1,
                                                changes_per_version=20), vnode_count=VNODES)
    return DeltaTable(f"{warehouse}/{table}").version()


@pytest.mark.spark
def test_one_follower_run_serves_every_mv_and_one_failing_does_not_stop_the_others(
        spark, tmp_path, warehouse, dagster_home):
    folder = tmp_path / "mvs"
    folder.mkdir()
    for name, body in MVS.items():
        (folder / name).write_text(yaml.safe_dump(body))
    _commit(warehouse, "upstream", 1)
    _commit(warehouse, "other", 2)
    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse, "BACKFILL_MV_DIR": str(folder)})
    defs, catalog = build_definitions(settings), load_catalog(settings)
    tables = {n: mv_tables(catalog.definition(n), settings) for n in catalog.names}
    instance = dg.DagsterInstance.local_temp(dagster_home)
    result: dict = {}

    def follow() -> None:
        result["run"] = defs.get_job_def("follower_job").execute_in_process(
            instance=instance, raise_on_error=False, run_config={
                "ops": {"follow_upstream": {"config": {"mv": "all", "poll_seconds": 0.2}}}})

    def follows() -> set[str]:
        [run] = instance.get_runs(dg.RunsFilter(job_name="follower_job"))
        return set(run.tags.get(FOLLOWS_TAG, "").split(","))

    def exact(names) -> None:
        for n in names:
            verdict = verify(spark, catalog.definition(n), tables[n])
            assert verdict.ok, (n, verdict.failures()[:3])

    def all_caught_up(names, up: int) -> bool:
        """Each MV at `up` of the upstream, b at a's latest (once a's first barrier wrote)."""
        if not caught_up(tables["a"], up, VNODES):
            return False
        mv_a = DeltaTable(tables["a"].mv).version()
        return all(caught_up(tables[n], mv_a if n == "b" else up, VNODES) for n in names)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_for("the pool to follow every MV", lambda: instance.get_runs(
        dg.RunsFilter(job_name="follower_job")) and follows() == {"a", "b", "c", "e"})
    assert {"a", "b", "c", "e"} <= mvs_in_flight(instance)
    for seed in (3, 4):  # a chain and its sibling follow each commit
        up = _commit(warehouse, "upstream", seed)
        wait_for(f"a, b, c at upstream v{up}", lambda u=up: all_caught_up("abc", u))
    exact("abce")

    # e's upstream loses a column e reads: e leaves the pool with its error; the others go on
    other = f"{warehouse}/other"
    write_deltalake(other, read_rows(DeltaTable(other)).drop_columns(["region"]),
                    mode="overwrite", schema_mode="overwrite", partition_by=["vnode"])
    wait_for("e to leave the pool", lambda: "e" not in follows())
    [seen] = instance.fetch_observations(dg.AssetKey(["e", "downstream_mv"]), limit=1).records
    error = seen.asset_observation.metadata["follower_error"].value
    assert error.startswith("UpstreamSchemaChanged") and "region" in error
    assert "e" not in mvs_in_flight(instance)
    [pool_run] = instance.get_runs(dg.RunsFilter(job_name="follower_job"))
    assert pool_run.tags[FAILED_TAG] == "e"  # the sensor's restart back-off counts it
    up = _commit(warehouse, "upstream", 5)
    wait_for(f"a, b, c at v{up} after e failed", lambda: all_caught_up("abc", up))
    exact("abc")

    # c stopped on request stops alone
    request_stop(tables["c"], "test")
    wait_for("c to leave the pool", lambda: "c" not in follows())
    c_at = {v: r["version"] for v, r in progress_rows(tables["c"]).items()}
    up = _commit(warehouse, "upstream", 6)
    wait_for(f"a, b at v{up} after c stopped", lambda: all_caught_up("ab", up))
    assert {v: r["version"] for v, r in progress_rows(tables["c"]).items()} == c_at
    exact("ab")

    defs.get_job_def("stop_follower_job").execute_in_process(
        instance=instance, run_config={"ops": {"request_follower_stop": {"config": {"mv": "all"}}}})
    thread.join(120)
    run = result["run"]
    assert not run.success  # it ends failed, naming the MV that failed and why
    [failure] = [e for e in run.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "MV 'e': UpstreamSchemaChanged" in failure.step_failure_data.error.message


def _sensor_of(tmp_path, warehouse, mvs: dict):
    """The continuous-mode sensor of a folder of `mvs` (name -> definition) over `upstream`,
    its tables, and a tick: the run requests it makes on an ephemeral instance."""
    folder = tmp_path / "mvs"
    folder.mkdir()
    for name, body in mvs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(body))
    _commit(warehouse, "upstream", 1)
    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse, "BACKFILL_MV_DIR": str(folder),
                              "BACKFILL_CONTINUOUS": "1"})
    sensor = build_definitions(settings).get_sensor_def("upstream_barrier_sensor")
    catalog = load_catalog(settings)
    tables = {n: mv_tables(catalog.definition(n), settings) for n in catalog.names}
    instance = dg.DagsterInstance.ephemeral()

    def tick() -> list[dg.RunRequest]:
        result = sensor(dg.build_sensor_context(instance=instance))
        return [] if isinstance(result, dg.SkipReason) else list(result)

    tick.job = build_definitions(settings).get_job_def("follower_job")
    tick.catalog = catalog
    return instance, tables, tick


def _launched(instance, request: dg.RunRequest, status=dg.DagsterRunStatus.NOT_STARTED):
    """The run a request becomes, with the request's own tags and config (what the daemon
    would create)."""
    from dagster._core.test_utils import create_run_for_test

    return create_run_for_test(instance, job_name="follower_job", status=status,
                               tags=request.tags, run_config=request.run_config)


def test_the_sensor_starts_one_follower_run_for_the_mvs_that_need_one(tmp_path, warehouse):
    """Continuous mode over a folder: the MVs needing a follower start as ONE pool run (in
    barrier order, a reader of an MV with the MV before its table exists; tagged so liveness
    counts it at once, created or started); no second run
    while it lives; an MV failing out of it is restarted alone; stopped MVs are left out and
    `follower: own` MVs get runs of their own."""
    from backfill_assets.barrier.follower import clear_stop
    from backfill_assets.wiring.liveness import MV_TAG, writers_over

    mvs = {n: {**BASE, "filter": f"qty > {i}"} for i, n in enumerate(("c", "a", "f"))}
    mvs["c"]["upstream"] = "a/downstream_mv"  # c reads a, whose table a's first barrier writes
    mvs["own"] = {**BASE, "follower": "own"}
    mvs["s"] = {**BASE, "filter": "qty > 9"}
    instance, tables, tick = _sensor_of(tmp_path, warehouse, mvs)
    request_stop(tables["s"], "test")
    requests = tick()
    [pool] = [r for r in requests if FOLLOWS_TAG in r.tags]
    [own] = [r for r in requests if FOLLOWS_TAG not in r.tags]
    names = pool.run_config["ops"]["follow_upstream"]["config"]["mvs"]
    assert sorted(names) == ["a", "c", "f"] and names.index("a") < names.index("c")
    assert pool.tags[FOLLOWS_TAG] == ",".join(names) and pool.tags[MV_TAG] == "a,c,f"
    assert own.tags[MV_TAG] == "own" and own.tags["backfill/vnodes"] == f"0-{VNODES - 1}"
    dg.validate_run_config(tick.job, pool.run_config)  # the launch takes its config
    run = _launched(instance, pool)
    _launched(instance, own, dg.DagsterRunStatus.STARTED)
    assert tick() == []  # created, not yet started
    instance.report_dagster_event(dg.DagsterEvent(dg.DagsterEventType.RUN_START.value,
                                                  "follower_job"), run.run_id)  # started
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    assert tick() == []
    assert {"a", "c", "f", "own"} <= mvs_in_flight(instance)

    # f fails out of the pool (the run takes it off its follows): a follower for f only
    instance.add_run_tags(run.run_id, {FOLLOWS_TAG: "c,a", FAILED_TAG: "f"})
    assert writers_over(instance, range(VNODES), VNODES, mv="f") == []
    [again] = tick()
    assert again.tags[MV_TAG] == "f" and FOLLOWS_TAG not in again.tags
    assert again.run_key.endswith(f"after:{run.run_id}")  # it replaces its part of the pool
    _launched(instance, again, dg.DagsterRunStatus.STARTED)
    assert tick() == []

    # s started again, and the pool dies with a and c: one pool of the three needing one
    clear_stop(tables["s"])
    instance.report_run_failed(instance.get_run_by_id(run.run_id), message="killed")
    [pool2] = tick()
    names2 = pool2.run_config["ops"]["follow_upstream"]["config"]["mvs"]
    assert sorted(names2) == ["a", "c", "s"]
    assert [n for n in names2 if n != "s"] == [n for n in names if n != "f"]  # barrier order
    assert pool2.run_key != pool.run_key


def test_an_mv_failing_out_of_pools_again_and_again_backs_off(tmp_path, warehouse):
    """The restart back-off counts an MV's failures in pool runs too: after the free restarts
    it waits, while an MV that only stopped with the pool is restarted at once."""
    from dagster._core.test_utils import create_run_for_test

    from backfill_assets.wiring.liveness import FREE_RESTARTS, MV_TAG

    instance, _, tick = _sensor_of(tmp_path, warehouse, {"a": BASE, "c": BASE})
    for _ in range(FREE_RESTARTS + 1):  # pools a left with an error, c stopped with well
        create_run_for_test(instance, job_name="follower_job",
                            status=dg.DagsterRunStatus.SUCCESS,
                            tags={MV_TAG: "a,c", FOLLOWS_TAG: "-", FAILED_TAG: "a"})
    [only] = tick()
    assert only.tags[MV_TAG] == "c"  # a waits out its back-off


def test_the_sensor_starts_no_follower_for_the_mvs_a_pool_follows(tmp_path, warehouse):
    """Continuous mode over a folder: the MVs a running pool lists in `backfill/follows` are
    followed; one taken off it (its error, or its stop) gets a one-MV follower of its own."""
    from dagster._core.test_utils import create_run_for_test

    from backfill_assets.wiring.liveness import MV_TAG, writers_over

    folder = tmp_path / "mvs"
    folder.mkdir()
    for name in ("a", "c"):
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(MVS[f"{name}.yaml"]))
    _commit(warehouse, "upstream", 1)
    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse, "BACKFILL_MV_DIR": str(folder),
                              "BACKFILL_CONTINUOUS": "1"})
    sensor = build_definitions(settings).get_sensor_def("upstream_barrier_sensor")
    instance = dg.DagsterInstance.ephemeral()

    def tick() -> list[dg.RunRequest]:
        result = sensor(dg.build_sensor_context(instance=instance))
        return [] if isinstance(result, dg.SkipReason) else list(result)

    [first] = tick()  # none follows them yet: one pool run for both
    assert first.tags[FOLLOWS_TAG] == "a,c"
    pool = create_run_for_test(instance, job_name="follower_job",
                               status=dg.DagsterRunStatus.STARTED,
                               tags={MV_TAG: "all", FOLLOWS_TAG: "a,c"})
    assert tick() == []
    assert [r.run_id for r in writers_over(instance, range(VNODES), VNODES, mv="c")] == \
        [pool.run_id]
    instance.add_run_tags(pool.run_id, {FOLLOWS_TAG: "a"})  # c left the pool
    assert [r.tags[MV_TAG] for r in tick()] == ["c"]
    assert writers_over(instance, range(VNODES), VNODES, mv="c") == []
    assert mvs_in_flight(instance) == {"a"}


def test_follower_is_pool_or_own_and_not_part_of_the_fingerprint():
    """`follower` says how an MV is served, not what it computes: a wrong value is refused by
    name, and changing it keeps the fingerprint (no reset)."""
    from backfill_assets.core.errors import InvalidMVDefinition
    from backfill_assets.core.mv_definition import MVDefinition

    body = {**BASE, "name": "a"}
    pooled, own = (MVDefinition.from_dict({**body, "follower": f}) for f in ("pool", "own"))
    assert MVDefinition.from_dict(body).follower == "pool"
    assert own.check_controls().follower == "own"
    assert own.fingerprint == pooled.fingerprint
    with pytest.raises(InvalidMVDefinition, match="follower 'shared' is not one of pool, own"):
        MVDefinition.from_dict({**body, "follower": "shared"}).check_controls()


@pytest.mark.spark
def test_the_sensors_pool_request_runs_a_chain_in_one_pass(spark, tmp_path, warehouse):
    """The sensor's request, run as the daemon would run it (its config and tags): one run
    follows a and b (b reads a, whose table does not exist yet) in one pass, both exact; once
    it ended, the next tick starts both again as one pool with a new run key."""
    mvs = {"a": {**BASE, "filter": "qty > 0"},
           "b": {**BASE, "upstream": "a/downstream_mv", "filter": "qty > 2"}}
    instance, tables, tick = _sensor_of(tmp_path, warehouse, mvs)
    [request] = tick()
    config = request.run_config["ops"]["follow_upstream"]["config"]
    assert config["mvs"] == ["a", "b"]
    result = tick.job.execute_in_process(instance=instance, tags=request.tags, run_config={
        "ops": {"follow_upstream": {"config": {**config, "max_barriers": 1,
                                               "poll_seconds": 0.2}}}})
    assert result.success
    assert DeltaTable(tables["a"].mv).version() >= 0
    for name in mvs:
        verdict = verify(spark, tick.catalog.definition(name), tables[name])
        assert verdict.ok, (name, verdict.failures()[:3])
    [again] = tick()
    assert again.run_config == request.run_config and again.run_key != request.run_key
