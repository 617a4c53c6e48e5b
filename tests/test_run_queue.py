"""The run queue of deploy/dagster.yaml holds its limits: one run at a time per MV (the tag
backfill/mv every barrier run carries, or that its coordinator adds from a run's config when
the launch gave none) and a limit on all runs at once, dequeued by Dagster's own queue daemon
(its launcher replaced by one that launches nothing, so no run executes)."""

from __future__ import annotations

import os
import time

import dagster as dg
import yaml
from dagster._core.test_utils import create_run_for_test, create_test_daemon_workspace_context
from dagster._core.workspace.load_target import EmptyWorkspaceTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

from backfill_assets.wiring.liveness import MV_TAG, vnodes_tag
from jobs.workspace_runs import repository_origin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _deployed() -> dict:
    """deploy/dagster.yaml's run coordinator and run limits, the launcher mocked."""
    with open(os.path.join(ROOT, "deploy", "dagster.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    return {"run_coordinator": config["run_coordinator"], "concurrency": config["concurrency"],
            "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}}


def _launched(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTING]))


def _queued(instance: dg.DagsterInstance, mv: str, first: int, last: int) -> dg.DagsterRun:
    """A barrier run as the sensor requests it, queued."""
    from dagster._core.remote_origin import RemoteJobOrigin

    return create_run_for_test(instance, job_name="backfill_job",
                               status=dg.DagsterRunStatus.QUEUED,
                               tags={MV_TAG: mv, **vnodes_tag(first, last)},
                               remote_job_origin=RemoteJobOrigin(repository_origin(),
                                                                 "backfill_job"))


def _dequeue(instance: dg.DagsterInstance) -> None:
    with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as ctx:
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(ctx))


def test_one_barrier_run_per_mv_and_a_limit_on_all_runs() -> None:
    overrides = _deployed()
    limit = overrides["concurrency"]["runs"]["max_concurrent_runs"]
    with dg.instance_for_test(overrides=overrides) as instance:
        # a tick of the sensor over two vnode ranges of MV a, and one run of each other MV
        mvs = [f"mv{i}" for i in range(limit + 2)]
        queued = [_queued(instance, "a", 0, 1), _queued(instance, "a", 2, 3)]
        for mv in mvs:
            _queued(instance, mv, 0, 3)
        _dequeue(instance)
        launched = _launched(instance)
        per_mv = [r.tags[MV_TAG] for r in launched]
        assert len(launched) == limit  # the limit on all runs at once
        assert len(per_mv) == len(set(per_mv))  # never two runs of one MV
        assert "a" in per_mv  # the oldest queued run goes first
        first = next(r for r in launched if r.tags[MV_TAG] == "a")
        assert first.run_id == queued[0].run_id
        # its range ends: the MV's second range is dequeued, still one run of it at a time
        instance.report_run_failed(first)  # ended (any end frees the slot)
        time.sleep(0.01)
        _dequeue(instance)
        again = [r.tags[MV_TAG] for r in _launched(instance)]
        assert again.count("a") == 1 and len(again) == limit
        assert instance.get_run_by_id(queued[1].run_id).status == dg.DagsterRunStatus.STARTING


def _launched_by_config(instance: dg.DagsterInstance, job: str, op: str,
                        config: dict) -> dg.DagsterRun:
    """A run as the launchpad launches it (launchRun: create the run, submit it to the
    instance's coordinator), naming its MV in config only: no backfill/mv tag."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.remote_origin import RemoteJobOrigin

    from jobs.workspace_runs import ATTRIBUTE, MODULE

    origin = ReconstructableRepository.for_module(MODULE, ATTRIBUTE, ROOT) \
        .get_reconstructable_job(job).get_python_origin()
    run = create_run_for_test(instance, job_name=job, status=dg.DagsterRunStatus.NOT_STARTED,
                              run_config={"ops": {op: {"config": config}}},
                              remote_job_origin=RemoteJobOrigin(repository_origin(), job),
                              job_code_origin=origin)
    assert MV_TAG not in run.tags
    return instance.submit_run(run.run_id, workspace=None)


def test_runs_naming_their_mv_in_config_only_are_held_one_per_mv() -> None:
    with dg.instance_for_test(overrides=_deployed()) as instance:
        a1 = _launched_by_config(instance, "backfill_job", "vnode_backfill", {"mv": "a"})
        a2 = _launched_by_config(instance, "verify_job", "verify_mv", {"mv": "a"})
        b = _launched_by_config(instance, "backfill_job", "vnode_backfill", {"mv": "b"})
        pool = _launched_by_config(instance, "follower_job", "follow_upstream",
                                   {"mvs": ["c", "a"]})
        assert [r.status for r in (a1, a2, b, pool)] == [dg.DagsterRunStatus.QUEUED] * 4
        assert [r.tags[MV_TAG] for r in (a1, a2, b, pool)] == ["a", "a", "b", "a,c"]
        _dequeue(instance)
        launched = {r.run_id for r in _launched(instance)}
        assert launched == {a1.run_id, b.run_id, pool.run_id}  # a2 waits: a1 is MV a's run
        instance.report_run_failed(instance.get_run_by_id(a1.run_id))
        time.sleep(0.01)
        _dequeue(instance)
        assert instance.get_run_by_id(a2.run_id).status == dg.DagsterRunStatus.STARTING


def test_the_mv_a_run_is_queued_under() -> None:
    """The tag the coordinator adds: the config's `mv` (any op), a follower's `mvs` sorted,
    else the prefix of the assets the run was launched for; a tag the launch gave stays."""
    from backfill_assets.wiring.run_coordinator import config_mv, mv_tag_for

    assert config_mv({"ops": {"vnode_backfill": {"config": {"mv": "a"}}}}) == "a"
    assert config_mv({"ops": {"follow_upstream": {"config": {"mvs": ["c", "a"]}}}}) == "a,c"
    assert config_mv({"ops": {"x": {"config": {"mv": None}}}, "resources": {}}) is None
    assert config_mv(None) is None and config_mv({"ops": {"x": None}}) is None
    asset_run = dg.DagsterRun(job_name="__ASSET_JOB", run_config={},
                              asset_selection=frozenset({dg.AssetKey(["b", "downstream_mv"])}))
    assert mv_tag_for(asset_run) == "b"
    tagged = dg.DagsterRun(job_name="backfill_job", tags={MV_TAG: "a"},
                           run_config={"ops": {"vnode_backfill": {"config": {"mv": "b"}}}})
    assert mv_tag_for(tagged) is None
