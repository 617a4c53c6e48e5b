"""set_controls_job: pause, resume, throttle or re-chunk the running backfill.

Takes effect at the next barrier; nothing restarts. The launchpad shows typed fields with
descriptions (snapshot is a choice, numbers are numbers); a contradictory or out-of-range
request fails with InvalidControl and writes nothing. The controls now in force are recorded
at once as an observation of `downstream_mv` and in the `backfill_finished` check's result
(state "paused", no ETA), so the asset page shows them before the next barrier runs.

    dagster job execute -m backfill_assets.definitions -j set_controls_job \
        -c jobs/configs/pause.yaml

In a folder catalog the config also names the MV (`mv: orders`), or `mv: all` for every MV;
every MV's request is checked before any is written.
"""


import dagster as dg
from pydantic import Field

from backfill_assets.barrier.runner import controls_in_force, figures
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.controls import (
    BarrierChoice,
    SnapshotSide,
    read_controls,
    requested,
    write_controls,
)
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.wiring.checks import progress_result
from backfill_assets.wiring.keys import MVAssets, MVChoice, Served, picked, served
from backfill_assets.wiring.metadata import controls_metadata
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


class ControlsConfig(MVChoice):
    """Give only what should change; the rest stays as it is (`mv: all`: for every MV)."""

    snapshot: SnapshotSide = Field(
        default=SnapshotSide.keep,
        description="pause: read no snapshot rows from the next barrier on (started vnodes "
                    "still receive their changes); resume: read again from the same positions, "
                    "unlimited unless rate_limit is given; keep: leave it as it is.")
    rate_limit: int | None = Field(
        default=None,
        description="Snapshot rows per second for a run (>= 1; 0 pauses). Unset: unchanged.")
    chunk_size: int | None = Field(
        default=None, description="Snapshot rows per vnode per barrier (>= 1). Unset: unchanged.")
    reset_chunk_size: bool = Field(
        default=False, description="Go back to the chunk size of the MV definition.")
    barrier_choice: BarrierChoice = Field(
        default=BarrierChoice.keep,
        description="A barrier over finished vnodes: auto re-snapshots them when re-reading "
                    "costs less than applying its changes (by what the MV measured); apply or "
                    "resnapshot force that path; keep: leave it as it is.")


def build_controls_job(d: MVDefinition | Served, settings: Settings) -> dg.JobDefinition:
    srv = served(d)

    @dg.op(name="set_controls")
    @named_first
    def set_controls(context: dg.OpExecutionContext, config: ControlsConfig,
                     warehouse: WarehouseResource) -> dg.Output:
        chosen = picked(context, srv, config.mv, allow_all=True)
        # every MV's request is checked before any is written: a bad one writes nothing
        for mv, _ in chosen:
            requested(read_controls(mv_tables(mv, settings, warehouse.options())),
                      config.snapshot, config.rate_limit, config.chunk_size,
                      config.reset_chunk_size, config.barrier_choice)
        meta = {}
        for mv, k in chosen:
            meta = _set_one(context, mv, k, settings, warehouse, config)
        return dg.Output(None, metadata=meta)

    @dg.job(name="set_controls_job", executor_def=dg.in_process_executor,
            description="Pause, resume or throttle the backfill; applies at the next barrier.")
    def set_controls_job():
        set_controls()

    return set_controls_job


def _set_one(context: dg.OpExecutionContext, d: MVDefinition, k: MVAssets, settings: Settings,
             warehouse: WarehouseResource, config: ControlsConfig) -> dict:
    """Write one MV's controls and record them on its asset and check at once."""
    tables = mv_tables(d, settings, warehouse.options())
    controls = write_controls(tables, requested(
        read_controls(tables), config.snapshot, config.rate_limit, config.chunk_size,
        config.reset_chunk_size, config.barrier_choice))
    in_force = controls_in_force(d, tables)
    context.log.info(f"controls of MV {d.name!r} from the next barrier: {in_force.describe()}")
    meta = controls_metadata(in_force)
    context.log_event(dg.AssetObservation(k.mv, metadata={
        **meta, "state": dg.MetadataValue.text(
            "paused (from the next barrier)" if controls.rate_limit == 0 else
            "controls changed (from the next barrier)")}))
    figs = figures(d, tables, in_force)
    if figs is not None:  # the check says "paused" (or resumed) now, not at the next barrier
        context.log_event(progress_result(context.instance, figs, in_force,
                                          vnode_states(tables), key=k.mv))
    return {**meta, "chunk_size": "definition" if controls.chunk_size is None
            else controls.chunk_size}
