"""The four vnode-partitioned assets. Wiring only: the work is `run_barrier`."""


import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backfill_assets.barrier import figures, run_barrier
from backfill_assets.controls import Controls
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.partitions import vnode_key, vnode_partitions, vnodes_of
from backfill_assets.progress_view import run_metadata, vnode_metadata
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource

UPSTREAM = dg.AssetKey("upstream_table")
REPLICA = dg.AssetKey("replicated_state")
MV = dg.AssetKey("downstream_mv")
PROGRESS = dg.AssetKey("backfill_progress")
OWNED = (REPLICA, MV, PROGRESS)


class BarrierConfig(dg.Config):
    """Per-run overrides; leave unset to use the controls in force (see set_controls_job)."""

    barrier_version: int | None = None
    chunk_size: int | None = None
    rate_limit: int | None = None


def build_assets(d: MVDefinition, settings: Settings, hook=None) -> list:
    """`upstream_table` (written by upstream_load_job or another engine) and the multi-asset
    that runs one barrier for the run's vnode range and materializes the three owned tables."""
    parts = vnode_partitions(d.vnode_count)
    upstream = dg.AssetSpec(UPSTREAM, partitions_def=parts, group_name="backfill",
                            description=f"The upstream Delta table {d.upstream} (change feed on).")
    specs = [
        dg.AssetSpec(REPLICA, deps=[UPSTREAM], partitions_def=parts, group_name="backfill",
                     description="The backfill's arrangement of the upstream, per vnode."),
        dg.AssetSpec(MV, deps=[REPLICA], partitions_def=parts, group_name="backfill",
                     description=f"MV {d.name!r}: Delta, partitioned by vnode, change feed on."),
        dg.AssetSpec(PROGRESS, deps=[MV], partitions_def=parts, group_name="backfill",
                     description="Backfill state: | vnode | pk... | finished | row_count |."),
    ]

    @dg.multi_asset(specs=specs, name="vnode_backfill", partitions_def=parts,
                    backfill_policy=dg.BackfillPolicy.single_run())
    def vnode_backfill(context: dg.AssetExecutionContext, config: BarrierConfig,
                       spark: LazyPySparkResource, warehouse: WarehouseResource):
        ranged = context.has_partition_key or context.has_partition_key_range
        vnodes = vnodes_of(context.partition_keys) if ranged else list(range(d.vnode_count))
        tables = mv_tables(d, settings, warehouse.options())
        overrides = Controls(config.chunk_size, config.rate_limit).validated()
        report = run_barrier(spark.spark_session, d, tables, vnodes,
                             version=config.barrier_version, overrides=overrides,
                             hook=hook or (lambda point: None))
        figs = figures(d, tables, report)
        if report.extra.get("resnapshots"):  # snapshot mode lost its change feed: say so
            context.log.warning(f"change feed gone, re-snapshot: {report.extra['resnapshots']}")
            context.log_event(dg.AssetObservation(MV, metadata={
                "resnapshots": dg.MetadataValue.text(report.extra["resnapshots"]),
                "resnapshot_vnodes": dg.MetadataValue.int(report.extra["resnapshot_vnodes"])}))
        context.log.info(
            f"barrier v{report.v_new} vnodes {vnodes[0]}..{vnodes[-1]}: "
            f"{report.snapshot_rows} snapshot rows, {report.forwarded_rows} forwarded, "
            f"{figs.percent_done:.1f}% done, {figs.vnodes_finished}/{d.vnode_count} finished")
        for vnode in vnodes:
            meta = vnode_metadata(report, vnode)
            key = vnode_key(vnode, d.vnode_count)
            for asset in OWNED:
                if ranged:
                    context.add_asset_metadata(meta, asset_key=asset, partition_key=key)
                else:
                    context.log_event(dg.AssetMaterialization(asset, partition=key, metadata=meta))
        summary = run_metadata(report, figs)
        for asset in OWNED:
            yield dg.MaterializeResult(asset_key=asset, metadata=summary)

    return [upstream, vnode_backfill]
