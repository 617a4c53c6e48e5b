"""Asset checks of `downstream_mv`: `matches_oracle` (the MV equals the independent oracle,
per vnode) and `backfill_finished` (passes once every vnode is finished).

`backfill_finished` is evaluated by every barrier with the MV's figures (percent done, rows/s,
ETA, lag) as metadata, so the check's Plots draw them over barriers and the lineage shows a
warning until the backfill is done; "Execute" on it reads the tables without a barrier.

Partitioned asset checks run once per ranged run (partition None), so the per-vnode results
go into one check's metadata. It is not part of a barrier: `vnode_backfill` never yields the MV
output (see assets.py), so a UI launch that adds the check to a barrier skips it instead of
recomputing the whole MV. `verify_job` (or "Execute" on the check) records its result here.
"""

from collections.abc import Callable

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from backfill_assets.barrier.runner import controls_in_force, figures
from backfill_assets.core.figures import MVFigures
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.verify.aggregate_oracle import verify_aggregate
from backfill_assets.verify.join_oracle import verify_join
from backfill_assets.verify.oracle import Verdict, verify
from backfill_assets.wiring.keys import MVAssets, single
from backfill_assets.wiring.metadata import figures_metadata
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource

CHECK_NAME = "matches_oracle"
PROGRESS_CHECK = "backfill_finished"
MV = dg.AssetKey("downstream_mv")  # a catalog of one's; a folder's MV: `MVAssets.mv`
SHOWN_VNODES = 16  # vnodes listed in the table besides every failing one


def run_oracle(spark: SparkSession, d: MVDefinition, tables,
               say: Callable[[str], None] = lambda _: None) -> tuple[Verdict, dict]:
    """Verify every vnode; the verdict plus the check's metadata (failing vnodes first).
    `say` hears each stage as it ends."""
    if d.joins:  # the join (and GROUP BY) recomputed by Spark SQL at the recorded version pair
        verdict = verify_join(spark, d, tables).as_verdict()
        say(f"compared {verdict.rows_compared} rows with Spark's join")
    elif d.is_aggregate:  # Spark's own GROUP BY at the MV's version (verify/aggregate_oracle.py)
        verdict = verify_aggregate(spark, d, tables)
        say(f"compared {verdict.rows_compared} groups with Spark's GROUP BY")
    else:
        verdict = verify(spark, d, tables, say=say)
    lines = ["| vnode | version | expected | actual | missing | unexpected |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {v.vnode} | {v.version} | {v.expected} | {v.actual} | {v.missing} | "
              f"{v.unexpected} |" for v in verdict.vnodes if not v.ok or v.vnode < SHOWN_VNODES]
    return verdict, {
        "rows_compared": dg.MetadataValue.int(verdict.rows_compared),
        "vnodes_compared": dg.MetadataValue.int(len(verdict.vnodes)),
        "vnodes_failed": dg.MetadataValue.int(len(verdict.failures())),
        "per_vnode": dg.MetadataValue.md("\n".join(lines)),
        "type_problems": dg.MetadataValue.text("\n".join(verdict.type_problems) or "(none)"),
    }


def evaluation(verdict: Verdict, metadata: dict, key: dg.AssetKey = MV
               ) -> dg.AssetCheckEvaluation:
    """The check's result as an event any op can log (verify_job does)."""
    return dg.AssetCheckEvaluation(asset_key=key, check_name=CHECK_NAME, passed=verdict.ok,
                                   metadata=metadata)


def progress_evaluation(figs: MVFigures, metadata: dict, key: dg.AssetKey = MV
                        ) -> dg.AssetCheckEvaluation:
    """`backfill_finished` as a barrier records it: a warning (not an error) until done."""
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name=PROGRESS_CHECK, passed=figs.finished,
        severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
        description=f"{figs.vnodes_finished}/{figs.vnode_count} vnodes finished, "
                    f"{figs.percent_done:.1f}% done, {figs.state}")


def on_latest_materialization(instance: dg.DagsterInstance,
                              evaluation: dg.AssetCheckEvaluation) -> dg.AssetCheckEvaluation:
    """`evaluation` naming the MV's latest materialization as the one it checked.

    Why: the asset page shows a check "Not evaluated" unless its latest result targets the
    asset's latest materialization. A result logged by an op names none, so Dagster compares
    times instead: the latest materialization against the check row's creation time, which
    SQLite keeps in whole seconds and which is the run's *start* when the run planned the
    check (the asset pages' launch does). A barrier that finished no vnode (most barriers
    mid-backfill) and began within the second the previous barrier materialized read "Not
    evaluated"; so did `backfill_finished` once the follower had materialized vnodes after
    it. Log the MV's events first, then this."""
    records = instance.fetch_materializations(evaluation.asset_key, limit=1).records
    if not records:
        return evaluation
    latest = records[0]
    return dg.AssetCheckEvaluation(
        asset_key=evaluation.asset_key, check_name=evaluation.check_name,
        passed=evaluation.passed, metadata=evaluation.metadata, severity=evaluation.severity,
        description=evaluation.description, blocking=evaluation.blocking,
        target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
            storage_id=latest.storage_id, run_id=latest.event_log_entry.run_id,
            timestamp=latest.timestamp))


def progress_result(instance: dg.DagsterInstance, figs: MVFigures, controls: Controls,
                    states: dict[int, str], barrier_version: int | None = None,
                    key: dg.AssetKey = MV) -> dg.AssetCheckEvaluation:
    """`backfill_finished` as a barrier (or a follower's barrier, or set_controls_job, so a
    pause shows at once) records it, after the MV's events of that barrier."""
    meta = figures_metadata(figs, controls, states)
    if barrier_version is not None:
        meta["barrier_version"] = dg.MetadataValue.int(barrier_version)
    return on_latest_materialization(instance, progress_evaluation(figs, meta, key))


def build_progress_check(d: MVDefinition, settings: Settings, keys: MVAssets | None = None
                         ) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=(keys or single(d)).mv, name=PROGRESS_CHECK, blocking=False,
                    description="Passes once every vnode is finished. Every barrier records it "
                                "with the MV's percent done, rows/s, ETA and lag (see Plots); "
                                "Execute reads the tables without running a barrier.")
    def backfill_finished(warehouse: WarehouseResource) -> dg.AssetCheckResult:
        tables = mv_tables(d, settings, warehouse.options())
        controls = controls_in_force(d, tables)
        figs = figures(d, tables, controls)
        if figs is None:
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       description="no barrier has run yet: run backfill_job")
        evaluated = progress_evaluation(figs, figures_metadata(figs, controls,
                                                               vnode_states(tables)))
        return dg.AssetCheckResult(passed=evaluated.passed, severity=evaluated.severity,
                                   metadata=evaluated.metadata,
                                   description=evaluated.description)

    return backfill_finished


def build_oracle_check(d: MVDefinition, settings: Settings, keys: MVAssets | None = None
                       ) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=(keys or single(d)).mv, name=CHECK_NAME, blocking=False,
                    description="MV[k] == f(upstream@v_k, key <= current_pos_k) for every vnode "
                                "(recomputes the whole MV: run it with verify_job or Execute).")
    def matches_oracle(spark: LazyPySparkResource,
                       warehouse: WarehouseResource) -> dg.AssetCheckResult:
        verdict, meta = run_oracle(spark.spark_session, d,
                                   mv_tables(d, settings, warehouse.options()))
        return dg.AssetCheckResult(passed=verdict.ok, metadata=meta)

    return matches_oracle
