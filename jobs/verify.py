"""verify_job: recompute the MV independently from the upstream and compare row for row.

Its verdict is recorded as the result of the asset check `downstream_mv/matches_oracle`, so
the asset page shows when the MV was last verified and how; the run fails on any difference.
In a folder catalog the config names the MV (`mv: orders`), or `mv: all` verifies every MV in
barrier order and fails if any differs.
"""


import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.wiring.checks import evaluation, on_latest_materialization, run_oracle
from backfill_assets.wiring.keys import MVAssets, MVChoice, Served, picked, served
from backfill_assets.wiring.named_errors import named_first
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


def build_verify_job(d: MVDefinition | Served, settings: Settings) -> dg.JobDefinition:
    srv = served(d)

    @dg.op(name="verify_mv", description="Compare every vnode of the MV with the oracle.")
    @named_first
    def verify_mv(context: dg.OpExecutionContext, config: MVChoice,
                  spark: LazyPySparkResource, warehouse: WarehouseResource) -> dg.Output:
        results = [(mv, *_verify_one(context, mv, k, settings, spark, warehouse))
                   for mv, k in picked(context, srv, config.mv, allow_all=True)]
        meta = results[0][3] if len(results) == 1 else {
            f"{mv.name}_matches": dg.MetadataValue.bool(ok) for mv, ok, _, _, _ in results}
        failed = [f"MV {mv.name!r} differs from the oracle {said}"
                  for mv, ok, _, _, said in results if not ok]
        if failed:
            raise dg.Failure("; ".join(failed), metadata=meta)
        return dg.Output(sum(r[2] for r in results), metadata=meta)

    @dg.job(name="verify_job", executor_def=dg.in_process_executor,
            description="Recompute the MV from the upstream at each vnode's recorded version "
                        "and compare row for row; records the asset check "
                        "downstream_mv/matches_oracle and fails on any difference.")
    def verify_job():
        verify_mv()

    return verify_job


def _verify_one(context: dg.OpExecutionContext, d: MVDefinition, k: MVAssets,
                settings: Settings, spark: LazyPySparkResource,
                warehouse: WarehouseResource) -> tuple[bool, int, dict, str]:
    """Verify one MV and record its check result: (ok, rows compared, the check's metadata,
    where it differs)."""
    context.log.info(f"verifying MV {d.name!r}: {d.vnode_count} vnodes recomputed from "
                     "the upstream at each vnode's version, compared row for row")
    verdict, meta = run_oracle(spark.spark_session, d,
                               mv_tables(d, settings, warehouse.options()),
                               say=lambda said: context.log.info(f"verify: {said}"))
    context.log_event(on_latest_materialization(context.instance,
                                                evaluation(verdict, meta, k.mv)))
    context.log.info(f"verified {verdict.rows_compared} rows over {len(verdict.vnodes)} "
                     f"vnodes: {len(verdict.failures())} vnodes differ")
    bad = ", ".join(f"{v.vnode}(-{v.missing}/+{v.unexpected})" for v in verdict.failures()[:20])
    types = f"; column types differ: {verdict.type_problems}" if verdict.type_problems else ""
    return verdict.ok, verdict.rows_compared, meta, f"in vnodes {bad or '(none)'}{types}"
