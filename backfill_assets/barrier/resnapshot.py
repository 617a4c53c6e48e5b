"""Re-snapshot on demand: re-read a vnode range of a finished MV from the upstream's latest
version, replacing those vnodes' MV rows (the Debezium "signal" case: a suspected drift, an
upstream repaired in place by a writer that left no change feed behind).

It is the re-snapshot snapshot mode already does when a change feed is gone (step/modes/
snapshot.py): steps with `StepRequest.reset`, each over a slice of about `slice_rows`
estimated rows, each one atomic MV commit that replaces its vnodes' rows (old rows deleted,
the vnodes read whole at the version) and carries their progress (Completed at the version),
so a crash loses at most the slice in flight and the next run or barrier recovers it. Any
mode's MV: the vnodes are read by snapshot mode's bulk read, and finished vnodes need nothing
of their mode afterwards (they only forward the change feed).

`resnapshot_steps` is those steps at a given version: a barrier that chooses by cost to
re-read its finished vnodes instead of applying its changes (barrier/by_cost.py) runs them
at the barrier's version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pyspark.sql import SparkSession

from backfill_assets import aggregate, storage
from backfill_assets.core.errors import ResnapshotRefused
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.snapshot import plan_slices
from backfill_assets.mv.controls import Controls, read_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import vnode_states
from backfill_assets.step.loop import run_step
from backfill_assets.step.modes.snapshot import SNAPSHOT, estimate_rows
from backfill_assets.step.request import Hook, StepReport, StepRequest, merged, no_hook

FINISHED = "finished"


def resnapshot(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
               hook: Hook = no_hook) -> StepReport:
    """Re-read `vnodes` (all finished) at the upstream's latest version; ResnapshotRefused
    (nothing written) for a vnode outside the MV or not finished."""
    vnodes = tuple(sorted(set(vnodes)))
    outside = [v for v in vnodes if not 0 <= v < d.vnode_count]
    if not vnodes or outside:
        raise ResnapshotRefused(
            f"MV {d.name!r} has vnodes 0..{d.vnode_count - 1}; asked for "
            f"{list(outside) or 'none'}: give first_vnode <= last_vnode within them")
    states = vnode_states(tables)
    unfinished = [v for v in vnodes if states.get(v) != FINISHED]
    if unfinished:
        raise ResnapshotRefused(
            f"MV {d.name!r}: vnodes {_span(unfinished)} are not finished; a re-snapshot "
            "re-reads finished vnodes (an unfinished one reads the latest version anyway: let "
            "its backfill finish, or reset_mv_job to start the MV over)")
    version = storage.latest_version(tables.upstream, tables.storage_options)
    chunk = read_controls(tables).chunk_size or d.chunk_size
    if d.is_aggregate:  # an aggregate MV is re-read whole (backfill_assets/aggregate/)
        report = aggregate.run_barrier(spark, d, tables, vnodes, version=version,
                                       controls=Controls(chunk), hook=hook, recompute=True)
        report.extra["resnapshot"] = f"every group recomputed at v{version}"
        return report
    req = StepRequest(d, SNAPSHOT, tables, vnodes, chunk, None, version)
    report = resnapshot_steps(spark, req, hook)
    report.extra["resnapshot"] = f"vnodes {_span(vnodes)} re-read at v{version}"
    return report


def resnapshot_steps(spark: SparkSession, req: StepRequest, hook: Hook = no_hook,
                     vnode_rows: dict[int, int] | None = None) -> StepReport:
    """Re-read `req.vnodes` (finished) whole at `req.v_new`: one step per slice of about
    `slice_rows` rows (`vnode_rows`: the estimate per vnode, when the caller has it), each an
    atomic MV commit replacing its vnodes' rows and carrying their progress, Completed at
    that version. Any mode's request: the steps are snapshot mode's."""
    if req.v_new is None:
        raise ValueError("a re-snapshot reads one pinned version: give the request's v_new")
    req = replace(req, mode=SNAPSHOT, rate_limit=None)
    vnodes = tuple(sorted(req.vnodes))
    rows = vnode_rows if vnode_rows is not None else estimate_rows(req, req.v_new, vnodes)
    slices = plan_slices({v: rows[v] for v in vnodes}, req.definition.slice_rows)
    report = merged([run_step(spark, replace(req, vnodes=s, reset=s), hook) for s in slices])
    report.extra["resnapshot_vnodes"] = len(vnodes)
    report.extra["slices_done"] = len(slices)
    return report


def _span(vnodes: Sequence[int]) -> str:
    return f"{vnodes[0]}..{vnodes[-1]}" if len(vnodes) > 1 else str(vnodes[0])
