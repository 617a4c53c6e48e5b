"""The change side of a step: the upstream's change rows the step's vnodes need, read once
as Arrow on the driver, then either kept there (few rows: `on_driver`; netted in Arrow and
applied by key lookups, `forwarded_keyed`) or turned into a cached Spark frame with the MV's
vnode (`in_spark`; netted in Spark, `forwarded`), and in both cases projected to the MV rows
each vnode's position already covers."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_assets import storage
from backfill_assets.arrow import netting  # the driver's path; Spark's below by name
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import OP, VNODE
from backfill_assets.core.planning import StepPlan
from backfill_assets.core.progress import BackfillState, NotStarted
from backfill_assets.engine.netting import net_changes, with_vnode
from backfill_assets.engine.projection import (
    KEEP,
    project,
    project_rows,
    visible_rows,
    with_vnode_versions,
)
from backfill_assets.mv import owned_tables
from backfill_assets.step.key_checks import check_change_keys
from backfill_assets.step.source_context import SourceContext
from backfill_assets.upstream import same_vnodes


def change_rows(ctx: SourceContext, plan: StepPlan) -> pa.Table | None:
    """The upstream's change rows (Arrow) after the oldest version any vnode of the step
    needs, keys checked; None when there are none."""
    starts = [p.forward_from for p in plan.vnodes if p.forward_from is not None]
    starts += [p.replicate_from for p in plan.vnodes
               if p.replicate and p.replicate_from is not None]
    if not starts or min(starts) >= plan.v_new:
        return None
    so = ctx.tables.storage_options
    arranged = same_vnodes(ctx.tables.upstream, plan.v_new, ctx.key_names, ctx.vnode_count, so)
    # the columns the MV reads, named: a version of the range without one of them is refused
    keep = [f.name for f in ctx.upstream_schema if f.name != VNODE]
    raw = storage.read_raw_changes(  # an upstream arranged by the MV's vnodes: only the
        ctx.tables.upstream, min(starts), plan.v_new, keep, storage_options=so,  # step's files
        vnodes=[p.vnode for p in plan.vnodes] if arranged else None)
    if raw.num_rows == 0:
        return None
    raw = raw.select([*keep, "_change_type", "_commit_version"])
    check_change_keys(raw, ctx.key_names, ctx.tables.upstream)
    return raw


def in_spark(ctx: SourceContext, plan: StepPlan, raw: pa.Table | None) -> DataFrame | None:
    """The change rows as a cached DataFrame with the MV's vnode, the step's vnodes only."""
    if raw is None:
        return None
    df = ctx.spark.createDataFrame(raw, schema=storage.spark_schema(raw.schema))
    df = with_vnode(df, ctx.key_names, ctx.key_types, ctx.vnode_count)
    return df.where(owned_tables.vnode_in(p.vnode for p in plan.vnodes)).cache()


def on_driver(ctx: SourceContext, plan: StepPlan, raw: pa.Table) -> pa.Table:
    """The change rows kept on the driver: with the MV's vnode (computed as in Spark), the
    step's vnodes only."""
    rows = netting.with_vnode(raw, ctx.key_names, ctx.key_types, ctx.vnode_count)
    return netting.newer_than(rows, {p.vnode: -1 for p in plan.vnodes})


def forward_since(plan: StepPlan, state: BackfillState) -> dict[int, int]:
    """Each forwarding vnode's version (its changes after it reach the MV) — NotStarted vnodes
    forward nothing."""
    return {p.vnode: p.forward_from for p in plan.vnodes if p.forward_from is not None
            and not isinstance(state.current(p.vnode), NotStarted)}


def forwarded_keyed(ctx: SourceContext, rows: pa.Table, state: BackfillState, plan: StepPlan,
                    d: MVDefinition) -> tuple[storage.KeyedRows | None, int]:
    """`forwarded` on the driver (`on_driver` rows): the visible changes netted per key with
    each key's row before the range, projected to MV rows; and how many keys they change.
    The row before is what the MV holds: a visible key is at or before its vnode's position,
    so the MV holds the upstream's row at the vnode's version (`forward_from`), which is the
    row before the first change after it."""
    since = forward_since(plan, state)
    progress = {v: state.current(v) for v in since}
    visible = netting.visible(netting.newer_than(rows, since), progress,
                                    state.key_order)
    netted = netting.net_with_prior(visible, ctx.key_names)
    if not netted.keys:
        return None, 0
    before, after = project_rows(ctx.spark, d, netted.before, netted.after,
                                 ctx.upstream_schema)
    return storage.KeyedRows(before, after), netted.keys


def forwarded(changes: DataFrame | None, state: BackfillState, plan: StepPlan,
              d: MVDefinition) -> DataFrame | None:
    """Netted changes each vnode's current position covers, projected to MV rows with `OP`
    (cached: it is counted, its keys collected and its rows written)."""
    since = forward_since(plan, state)
    progress = {v: state.current(v) for v in since}
    if changes is None or not since:
        return None
    net = net_changes(with_vnode_versions(changes, since), state.key_order.names)
    visible = project(visible_rows(net, progress, state.key_order), d)
    op = F.when((F.col(OP) == "delete") | ~F.col(KEEP), F.lit("delete")).otherwise("upsert")
    return visible.withColumn(OP, op).drop(KEEP).cache()
