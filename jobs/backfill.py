"""backfill_job: one barrier for a vnode range (all vnodes when no range tag is given).

    dagster job execute -m backfill_assets.definitions -j backfill_job --tags \
      '{"dagster/asset_partition_range_start": "00", "dagster/asset_partition_range_end": "31"}'

(keys zero-padded to the vnode count's width: `00`..`63` for 64 vnodes; a key that does not
exist is refused with `UnknownVnodePartition`, wiring/partitions.py).
"""

import dagster as dg

from backfill_assets.wiring.liveness import BACKFILL_JOB, MV_TAG


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
