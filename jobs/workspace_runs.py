"""Run a job of the workspace in this process, recorded as `dagster dev` records its own runs.

Why: Dagster's Timeline (Overview > Timeline) draws only runs that carry a *remote origin*
(the code location and repository they belong to; `repositoryOrigin` in GraphQL) and groups
them by it. `JobDefinition.execute_in_process`, `dg.materialize` and `dagster job execute` record
runs without one, so the demo's runs were on the Runs page but missing from the Timeline.

`run_in_workspace` creates the run with the origin of the code location `workspace.yaml`
declares (read from the file, no code server is started) and the job's Python origin, then
executes it here with `execute_run`: the same in-process executor and resources, and the warm
Spark session of this process is reused from run to run (the demo depends on that).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.execution.api import execute_run
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load import location_origins_from_yaml_paths

from backfill_assets.storage import memoized

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKSPACE = os.path.join(ROOT, "workspace.yaml")
MODULE, ATTRIBUTE = "backfill_assets.definitions", "defs"  # what workspace.yaml loads
ASSET_JOB = "__ASSET_JOB"  # the job the asset pages' "Materialize" launches


class WorkspaceLocationMissing(RuntimeError):
    """workspace.yaml does not declare the code location this module runs jobs of."""


@memoized("workspace repository origins", 8)
def repository_origin(workspace: str = WORKSPACE) -> RemoteRepositoryOrigin:
    """The origin `dagster dev -w workspace.yaml` gives the repository of backfill_assets."""
    origins = location_origins_from_yaml_paths([workspace])
    for origin in origins:
        target = getattr(origin, "loadable_target_origin", None)
        if target is not None and target.module_name == MODULE:
            return RemoteRepositoryOrigin(origin, SINGLETON_REPOSITORY_NAME)
    raise WorkspaceLocationMissing(
        f"{workspace} declares no code location loading {MODULE}: restore its python_module "
        f"entry (module_name: {MODULE}, attribute: {ATTRIBUTE})")


def run_in_workspace(instance: dg.DagsterInstance, job_name: str, *,
                     run_config: Mapping | None = None, tags: Mapping[str, str] | None = None,
                     asset_selection: set[dg.AssetKey] | None = None,
                     raise_on_error: bool = True) -> dg.JobExecutionResult:
    """Execute `job_name` of the workspace's definitions here, as a run the Timeline shows.

    `asset_selection` with ASSET_JOB is what "Materialize" on the asset pages launches (the
    checks of the selected assets come along, as in the UI's dialog)."""
    recon = ReconstructableRepository.for_module(MODULE, ATTRIBUTE, ROOT) \
        .get_reconstructable_job(job_name)
    job_def = recon.get_definition()
    run = instance.create_run_for_job(
        job_def, run_config=dict(run_config or {}), tags={**job_def.run_tags, **(tags or {})},
        asset_selection=frozenset(asset_selection) if asset_selection else None,
        remote_job_origin=RemoteJobOrigin(repository_origin(), job_name),
        job_code_origin=recon.get_python_origin())
    return execute_run(recon, run, instance, raise_on_error=raise_on_error)


def stop_sensor(instance: dg.DagsterInstance, name: str) -> None:
    """Record the workspace's sensor `name` as stopped, as "Stop sensor" in the UI would, so a
    `dagster dev` started afterwards never ticks it (tests that launch runs from the UI)."""
    from dagster._core.remote_origin import RemoteInstigatorOrigin
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
    )

    origin = RemoteInstigatorOrigin(repository_origin(), name)
    state = InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.STOPPED,
                            SensorInstigatorData(sensor_type=None))
    if instance.get_instigator_state(origin.get_id(), state.selector_id) is None:
        instance.add_instigator_state(state)
    else:
        instance.update_instigator_state(state)

