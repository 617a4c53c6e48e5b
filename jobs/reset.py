"""reset_mv_job: drop the MV, its replica and its progress so the next barrier rebuilds it.

The way out of `MVDefinitionChanged` (an edited filter, computed column or column list) and
`VnodeCountChanged`: the state on disk was built for another definition. The config must name
the MV (`confirm`), since a reset cannot be undone:

    dagster job execute -m backfill_assets.definitions -j reset_mv_job \
        -c jobs/configs/reset.yaml

Dagster's record of the MV goes with it: the partition materializations of `downstream_mv`,
`backfill_progress` and `replicated_state` and the results of both checks of the MV are wiped
(`DagsterInstance.wipe_assets`; runs stay), so the lineage says 0% filled, as the tables are:
nothing started. `backfill_finished` then records a warning ("0/N vnodes finished: reset"):
with no result at all, the lineage would draw a green "0 / 2 Passed".
"""


import dagster as dg

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.reset import reset_mv
from backfill_assets.wiring.checks import PROGRESS_CHECK
from backfill_assets.wiring.events import MV, PROGRESS, REPLICA
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings


class ResetConfig(dg.Config):
    """Type the MV's name to confirm: the reset deletes its tables."""

    confirm: str


def build_reset_job(d: MVDefinition, settings: Settings) -> dg.JobDefinition:
    @dg.op(name="reset_mv")
    @named_first
    def reset_mv_op(context: dg.OpExecutionContext, config: ResetConfig) -> dg.Output:
        deleted = reset_mv(d.name, mv_tables(d, settings), config.confirm)
        # the partition statuses and check results described the deleted tables
        context.instance.wipe_assets([MV, PROGRESS, REPLICA])
        # with no result at all the lineage draws a green "0 / 2 Passed"; the truth is a
        # backfill that has not started: `backfill_finished` a warning until it finishes
        context.log_event(dg.AssetCheckEvaluation(
            asset_key=MV, check_name=PROGRESS_CHECK, passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"0/{d.vnode_count} vnodes finished: reset, the next barrier rebuilds "
                        "the MV",
            metadata={"state": dg.MetadataValue.text("reset"),
                      "vnodes_finished": dg.MetadataValue.int(0),
                      "percent_done": dg.MetadataValue.float(0.0)}))
        context.log.info(f"MV {d.name!r} reset: deleted {deleted or 'nothing (no state)'}; "
                         "partition statuses and check results wiped; the next barrier "
                         "rebuilds it under the current definition")
        return dg.Output(None, metadata={"deleted": "\n".join(deleted) or "(nothing)",
                                         "fingerprint": d.fingerprint})

    @dg.job(name="reset_mv_job", executor_def=dg.in_process_executor,
            description="Drop the MV, its replica and its progress (the upstream and the "
                        "controls are kept) and wipe their partition statuses and the MV's "
                        "check results; the next barrier rebuilds the MV from scratch under "
                        "the current definition. Config: confirm = the MV's name.")
    def reset_mv_job():
        reset_mv_op()

    return reset_mv_job
