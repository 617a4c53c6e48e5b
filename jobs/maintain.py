"""maintain_job: the documented maintenance of the MV and its replica.

Compaction (files with many deleted rows, small barrier files, too many DV'd files), garbage
collection of superseded deletion-vector files, a lite vacuum of removed data files, and a
checkpoint. Never run deltalake 1.6.6's ``vacuum(full=True)`` on these tables: it deletes live
DV files (docs/ARCHITECTURE.md, "The storage layer").

    dagster job execute -m backfill_assets.definitions -j maintain_job

In a folder catalog the config names the MV (`mv: orders`), or `mv: all` maintains every MV.
"""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.storage import DV_KEEP_VERSIONS, DV_MIN_AGE_SECONDS, maintain, open_mor_table
from backfill_assets.wiring.keys import MVChoice, Served, picked, served
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


class MaintainConfig(MVChoice):
    """Retention of removed files and of DV files (the defaults keep a week of time travel)."""

    retention_hours: float = Field(
        default=168.0, ge=0, description="removed data files older than this are deleted")
    dv_keep_versions: int = Field(
        default=DV_KEEP_VERSIONS, ge=0,
        description="DV files a reader of the last N versions may need are kept")
    dv_min_age_seconds: float = Field(
        default=DV_MIN_AGE_SECONDS, ge=0,
        description="DV files younger than this are kept (commits in flight)")


def build_maintain_job(d: MVDefinition | Served, settings: Settings) -> dg.JobDefinition:
    srv = served(d)

    @dg.op(name="maintain_tables", description="Compact, collect DV garbage, vacuum, checkpoint.")
    @named_first
    def maintain_tables(context: dg.OpExecutionContext, config: MaintainConfig,
                        spark: LazyPySparkResource, warehouse: WarehouseResource) -> dg.Output:
        chosen = picked(context, srv, config.mv, allow_all=True)
        meta: dict = {}
        for d, _ in chosen:
            prefix = "" if len(chosen) == 1 else f"{d.name}_"
            meta.update(_maintain_one(context, d, settings, config, spark, warehouse, prefix))
        return dg.Output(None, metadata=meta)

    @dg.job(name="maintain_job", executor_def=dg.in_process_executor,
            description="Maintenance of the MV and its replica (compaction, DV garbage, lite "
                        "vacuum, checkpoint). The only supported way to vacuum these tables.")
    def maintain_job():
        maintain_tables()

    return maintain_job


def _maintain_one(context: dg.OpExecutionContext, d: MVDefinition, settings: Settings,
                  config: MaintainConfig, spark: LazyPySparkResource,
                  warehouse: WarehouseResource, prefix: str) -> dict:
    """Maintain one MV's tables; their reports as metadata (keys prefixed by `prefix`)."""
    tables = mv_tables(d, settings, warehouse.options())
    meta: dict = {}
    for name, uri in (("mv", tables.mv), ("replica", tables.replica)):
        if open_mor_table(uri, tables.storage_options) is None:
            continue
        report = maintain(spark.spark_session, uri, [k.name for k in d.primary_key],
                          tables.storage_options, retention_hours=config.retention_hours,
                          dv_keep_versions=config.dv_keep_versions,
                          dv_min_age_seconds=config.dv_min_age_seconds)
        context.log.info(f"{name}: {report}")
        meta.update({f"{prefix}{name}_{k}": v for k, v in vars(report).items()
                     if v is not None})
    return meta
