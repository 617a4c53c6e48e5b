"""set_controls_job: change the rate limit / chunk size of the running backfill.

Takes effect at the next barrier; nothing restarts.

    dagster job execute -m backfill_assets.definitions -j set_controls_job \
        -c jobs/configs/pause.yaml
"""


import dagster as dg

from backfill_assets.barrier import mv_root
from backfill_assets.controls import update_controls
from backfill_assets.core.mv_definition import MVDefinition
from resources.mv import mv_tables
from resources.settings import Settings


class ControlsConfig(dg.Config):
    """Give a value to change it: rate_limit rows/s ("0" pauses, "unlimited" resumes),
    chunk_size rows ("unset" restores the MV definition's)."""

    rate_limit: str | None = None
    chunk_size: str | None = None


def build_controls_job(d: MVDefinition, settings: Settings) -> dg.JobDefinition:
    @dg.op(name="set_controls")
    def set_controls(context: dg.OpExecutionContext, config: ControlsConfig) -> dg.Output:
        controls = update_controls(mv_root(mv_tables(d, settings)),
                                   chunk_size=config.chunk_size, rate_limit=config.rate_limit)
        context.log.info(f"controls of MV {d.name!r} now: {controls}")
        return dg.Output(None, metadata={
            "rate_limit": "unlimited" if controls.rate_limit is None else controls.rate_limit,
            "paused": controls.rate_limit == 0,
            "chunk_size": "definition" if controls.chunk_size is None else controls.chunk_size,
        })

    @dg.job(name="set_controls_job", executor_def=dg.in_process_executor,
            description="Pause, resume or throttle the backfill; applies at the next barrier.")
    def set_controls_job():
        set_controls()

    return set_controls_job
