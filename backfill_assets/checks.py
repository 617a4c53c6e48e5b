"""Asset check `downstream_mv/matches_oracle`: the MV equals the independent oracle, per vnode.

Partitioned asset checks run once per ranged run (partition None), so the per-vnode results
go into one check's metadata. It is not part of a barrier: `vnode_backfill` never yields the MV
output (see assets.py), so a UI launch that adds the check to a barrier skips it instead of
recomputing the whole MV. `verify_job` (or "Execute" on the check) records its result here.
"""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.oracle import Verdict, verify
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource

CHECK_NAME = "matches_oracle"
SHOWN_VNODES = 16  # vnodes listed in the table besides every failing one


def run_oracle(spark: SparkSession, d: MVDefinition, tables) -> tuple[Verdict, dict]:
    """Verify every vnode; the verdict plus the check's metadata (failing vnodes first)."""
    verdict = verify(spark, d, tables)
    lines = ["| vnode | version | expected | actual | missing | unexpected |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {v.vnode} | {v.version} | {v.expected} | {v.actual} | {v.missing} | "
              f"{v.unexpected} |" for v in verdict.vnodes if not v.ok or v.vnode < SHOWN_VNODES]
    return verdict, {
        "rows_compared": dg.MetadataValue.int(verdict.rows_compared),
        "vnodes_compared": dg.MetadataValue.int(len(verdict.vnodes)),
        "vnodes_failed": dg.MetadataValue.int(len(verdict.failures())),
        "per_vnode": dg.MetadataValue.md("\n".join(lines)),
    }


def evaluation(verdict: Verdict, metadata: dict) -> dg.AssetCheckEvaluation:
    """The check's result as an event any op can log (verify_job does)."""
    return dg.AssetCheckEvaluation(asset_key=dg.AssetKey("downstream_mv"), check_name=CHECK_NAME,
                                   passed=verdict.ok, metadata=metadata)


def build_oracle_check(d: MVDefinition, settings: Settings) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset="downstream_mv", name=CHECK_NAME, blocking=False,
                    description="MV[k] == f(upstream@v_k, key <= current_pos_k) for every vnode "
                                "(recomputes the whole MV: run it with verify_job or Execute).")
    def matches_oracle(spark: LazyPySparkResource,
                       warehouse: WarehouseResource) -> dg.AssetCheckResult:
        verdict, meta = run_oracle(spark.spark_session, d,
                                   mv_tables(d, settings, warehouse.options()))
        return dg.AssetCheckResult(passed=verdict.ok, metadata=meta)

    return matches_oracle
