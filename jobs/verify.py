"""verify_job: recompute the MV independently from the upstream and compare row for row.

Its verdict is recorded as the result of the asset check `downstream_mv/matches_oracle`, so
the asset page shows when the MV was last verified and how; the run fails on any difference.
"""


import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.wiring.checks import evaluation, on_latest_materialization, run_oracle
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


def build_verify_job(d: MVDefinition, settings: Settings) -> dg.JobDefinition:
    @dg.op(name="verify_mv", description="Compare every vnode of the MV with the oracle.")
    @named_first
    def verify_mv(context: dg.OpExecutionContext, spark: LazyPySparkResource,
                  warehouse: WarehouseResource) -> dg.Output:
        context.log.info(f"verifying MV {d.name!r}: {d.vnode_count} vnodes recomputed from "
                         "the upstream at each vnode's version, compared row for row")
        verdict, meta = run_oracle(spark.spark_session, d,
                                   mv_tables(d, settings, warehouse.options()),
                                   say=lambda said: context.log.info(f"verify: {said}"))
        context.log_event(on_latest_materialization(context.instance, evaluation(verdict, meta)))
        context.log.info(f"verified {verdict.rows_compared} rows over {len(verdict.vnodes)} "
                         f"vnodes: {len(verdict.failures())} vnodes differ")
        if not verdict.ok:
            bad = ", ".join(f"{v.vnode}(-{v.missing}/+{v.unexpected})"
                            for v in verdict.failures()[:20])
            types = f"; column types differ: {verdict.type_problems}" \
                if verdict.type_problems else ""
            raise dg.Failure(f"MV {d.name!r} differs from the oracle in vnodes {bad or '(none)'}"
                             f"{types}", metadata=meta)
        return dg.Output(verdict.rows_compared, metadata=meta)

    @dg.job(name="verify_job", executor_def=dg.in_process_executor,
            description="Recompute the MV from the upstream at each vnode's recorded version "
                        "and compare row for row; records the asset check "
                        "downstream_mv/matches_oracle and fails on any difference.")
    def verify_job():
        verify_mv()

    return verify_job
