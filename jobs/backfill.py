"""backfill_job: one barrier for a vnode range (all vnodes when no range tag is given).

    dagster job execute -m backfill_assets.definitions -j backfill_job --tags \
      '{"dagster/asset_partition_range_start": "00", "dagster/asset_partition_range_end": "31"}'

(keys zero-padded to the vnode count's width: `00`..`63` for 64 vnodes; a key that does not
exist is refused with `UnknownVnodePartition`, wiring/partitions.py).

In a folder catalog (`BACKFILL_MV_DIR`) the MVs have vnode counts of their own, so
`backfill_job` is one op job that takes the MV by the tag `backfill/mv` (or the config's `mv`)
and the vnodes by the tag `backfill/vnodes` ("first-last"; unset: all), as the barrier sensor
launches it; one job rather than one per MV keeps the code location's load flat in the number
of MVs (docs/CATALOG.md, measured):

    dagster job execute -m backfill_assets.definitions -j backfill_job --tags \
      '{"backfill/mv": "orders", "backfill/vnodes": "0-1"}'
"""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from backfill_assets.core.errors import UnknownVnodePartition
from backfill_assets.step.request import Hook, no_hook
from backfill_assets.wiring.assets import BarrierConfig, run_barriers
from backfill_assets.wiring.keys import Served
from backfill_assets.wiring.liveness import BACKFILL_JOB, MV_TAG, run_vnodes
from backfill_assets.wiring.named_errors import named_first
from resources.settings import Settings
from resources.warehouse import WarehouseResource


def build_backfill_job(partitions_def: dg.PartitionsDefinition, mv_name: str | None = None):
    """The job; every run of it carries ``backfill/mv=<mv_name>`` (a per-MV concurrency key)."""
    return dg.define_asset_job(
        BACKFILL_JOB,
        # every asset of the barrier's multi-asset: downstream_mv, backfill_progress and, in
        # arrangement mode only, replicated_state (wiring/assets.py); an input of the run's
        # assets that is not selected but has events would have Dagster fetch its data
        # versions, which fails in a run without a partition range
        selection=(dg.AssetSelection.assets("backfill_progress").upstream(depth=2)
                   .materializable()).without_checks(),
        partitions_def=partitions_def,
        executor_def=dg.in_process_executor,
        description="One barrier of the vnode backfill for the run's vnode range.",
        tags={MV_TAG: mv_name} if mv_name else None,
    )


class CatalogBarrierConfig(BarrierConfig):
    """`BarrierConfig` with the MV to run (unset: the run's tag backfill/mv)."""

    mv: str | None = Field(default=None, description="The MV (unset: the tag backfill/mv).")


def build_catalog_backfill_job(served: Served, settings: Settings,
                               hook: Hook = no_hook) -> dg.JobDefinition:
    """The folder catalog's `backfill_job`: the same barrier op (`run_barriers`) as the
    multi-asset's, for the MV and vnodes the run names."""

    @dg.op(name="vnode_backfill", description="One barrier of the MV the run names.")
    @named_first
    def vnode_backfill(context: dg.OpExecutionContext, config: CatalogBarrierConfig,
                       spark: LazyPySparkResource, warehouse: WarehouseResource) -> None:
        d, k = served.pick(config.mv or context.run.tags.get(MV_TAG))
        if context.run.tags.get(MV_TAG) != d.name:  # the per-MV concurrency key and liveness
            context.instance.add_run_tags(context.run_id, {MV_TAG: d.name})
        vnodes = list(run_vnodes(context.run, d.vnode_count))
        if not vnodes or vnodes[0] < 0 or vnodes[-1] >= d.vnode_count:
            raise UnknownVnodePartition(
                f"vnodes {vnodes[0] if vnodes else ''}..{vnodes[-1] if vnodes else ''} are not "
                f"vnodes of MV {d.name!r}, which has 0..{d.vnode_count - 1}: tag the run "
                "backfill/vnodes=first-last within them")
        run_barriers(context, d, k, settings, vnodes, config, spark, warehouse, hook)

    @dg.job(name=BACKFILL_JOB, executor_def=dg.in_process_executor,
            description="One barrier of the MV named by the tag backfill/mv (or config mv) "
                        "for the vnodes of the tag backfill/vnodes (unset: all).")
    def backfill_job():
        vnode_backfill()

    return backfill_job
