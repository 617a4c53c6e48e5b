"""reset_mv_job: drop the MV, its replica and its progress so the next barrier rebuilds it.

The way out of `MVDefinitionChanged` (an edited filter, computed column or column list) and
`VnodeCountChanged`: the state on disk was built for another definition. The config must name
the MV (`confirm`), since a reset cannot be undone (in a folder catalog `mv` names it too):

    dagster job execute -m backfill_assets.definitions -j reset_mv_job \
        -c jobs/configs/reset.yaml

Dagster's record of the MV goes with it: the partition materializations of `downstream_mv`,
`backfill_progress` and `replicated_state` and the results of both checks of the MV are wiped
(`DagsterInstance.wipe_assets`; runs stay), so the lineage says 0% filled, as the tables are:
nothing started. `backfill_finished` then records a warning ("0/N vnodes finished: reset"):
with no result at all, the lineage would draw a green "0 / 2 Passed".

Dropping an MV of a folder catalog: delete its file (its barriers stop at the next reload; its
tables stay), then run this job with `mv` and `confirm` naming it: an MV the catalog no longer
holds healthy (dropped, or broken) has its tables under `<warehouse>/<mv>` deleted and its
asset history wiped. Refused while a healthy MV still reads its output.
"""


import dagster as dg

from backfill_assets.core.catalog import name_problem
from backfill_assets.core.errors import MVResetRefused
from backfill_assets.core.lineage import table_key
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.reset import reset_mv
from backfill_assets.wiring.checks import PROGRESS_CHECK
from backfill_assets.wiring.keys import MVChoice, Served, in_folder, picked, served
from backfill_assets.wiring.liveness import MV_TAG
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings


class ResetConfig(MVChoice):
    """Type the MV's name to confirm: the reset deletes its tables (one MV at a time)."""

    confirm: str


def build_reset_job(d: MVDefinition | Served, settings: Settings) -> dg.JobDefinition:
    srv = served(d)

    @dg.op(name="reset_mv")
    @named_first
    def reset_mv_op(context: dg.OpExecutionContext, config: ResetConfig) -> dg.Output:
        name = config.mv or context.run.tags.get(MV_TAG)
        if srv.folder and name and name not in srv.names:
            return _drop(context, srv, settings, name, config.confirm)
        [(d, k)] = picked(context, srv, config.mv)
        deleted = reset_mv(d.name, mv_tables(d, settings), config.confirm)
        # the partition statuses and check results described the deleted tables
        context.instance.wipe_assets([k.mv, k.progress, k.replica])
        # with no result at all the lineage draws a green "0 / 2 Passed"; the truth is a
        # backfill that has not started: `backfill_finished` a warning until it finishes
        context.log_event(dg.AssetCheckEvaluation(
            asset_key=k.mv, check_name=PROGRESS_CHECK, passed=False,
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


def _drop(context: dg.OpExecutionContext, srv: Served, settings: Settings, name: str,
          confirm: str) -> dg.Output:
    """Delete the tables of an MV the catalog no longer serves (a dropped or broken file)."""
    problem = name_problem(name)
    if problem:
        raise MVResetRefused(f"{problem}; nothing was deleted")
    tables = MVTables.under(settings.warehouse_root, name, settings.warehouse_root,
                            settings.storage_options())
    readers = srv.catalog.lineage.external.get(table_key(tables.mv), ()) if srv.catalog else ()
    if readers:
        raise MVResetRefused(
            f"MV {name!r} is not in the catalog, but {', '.join(readers)} still read its "
            f"output {tables.mv}: nothing was deleted; point them at another table first")
    deleted = reset_mv(name, tables, confirm)
    k = in_folder(name)
    context.instance.wipe_assets([k.mv, k.progress, k.replica])
    context.instance.add_run_tags(context.run_id, {MV_TAG: name})
    context.log.info(f"dropped MV {name!r}: deleted {deleted or 'nothing (no state)'}")
    return dg.Output(None, metadata={"deleted": "\n".join(deleted) or "(nothing)"})
