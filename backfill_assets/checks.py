"""Asset check: the MV equals the independent oracle, vnode by vnode.

Partitioned asset checks run once per ranged run (partition None), so the per-vnode results
go into one check's metadata. Not part of backfill_job (it recomputes the whole MV): run it from
the UI or with verify_job.
"""

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.oracle import verify
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


def build_oracle_check(d: MVDefinition, settings: Settings) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset="downstream_mv", name="matches_oracle", blocking=False,
                    description="MV[k] == f(upstream@v_k, key <= current_pos_k) for every vnode.")
    def matches_oracle(spark: LazyPySparkResource,
                       warehouse: WarehouseResource) -> dg.AssetCheckResult:
        verdict = verify(spark.spark_session, d, mv_tables(d, settings, warehouse.options()))
        failed = verdict.failures()
        return dg.AssetCheckResult(
            passed=verdict.ok,
            metadata={
                "rows_compared": verdict.rows_compared,
                "vnodes_compared": len(verdict.vnodes),
                "vnodes_failed": [f"{v.vnode}: -{v.missing}/+{v.unexpected}" for v in failed][:50],
                "type_problems": verdict.type_problems,
            },
        )

    return matches_oracle
