"""What a barrier tells Dagster: partition statuses that are the truth, and one summary event.

Partition statuses (the Partitions tabs, the lineage's "filled"):
- `backfill_progress` partition k is materialized once vnode k has **started** (a barrier read
  some of its snapshot or it is finished); a barrier that did not start a vnode (paused, or a
  vnode outside its range) records nothing for it;
- `downstream_mv` partition k is materialized once vnode k is **finished**; every barrier that
  covers a finished vnode materializes it again (the vnode is then current at that barrier's
  version), so a partition's latest materialization names the barrier that last brought it up
  to date;
- `replicated_state` partition k is materialized by the barriers that keep the replica of a
  started vnode (arrangement mode, snapshot mode's throttled path).
The per-vnode events carry two facts only (state, version): the per-vnode detail (state,
position, rows, version, lag) goes into ONE table per barrier, on the barrier's summary event.

The summary event is the barrier's last event of `downstream_mv`: a materialization without a
partition (the MV as a whole after the barrier; it changes no partition's status), so the
asset's Overview, which shows the latest materialization, shows the MV's figures: mode, state,
live rows, vnodes finished / in progress / not started, percent done, lag in versions and
seconds, rows/s, ETA, and the per-vnode table. (In a run of a Dagster backfill, which refuses
a materialization without a partition, it goes on the last finished vnode the barrier covered,
or is an observation; see `record_barrier`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dagster as dg

from backfill_assets import storage
from backfill_assets.core.figures import MVFigures
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.progress import Completed, NotStarted
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import StepReport
from backfill_assets.wiring.keys import MVAssets, single
from backfill_assets.wiring.metadata import barrier_metadata, vnode_table
from backfill_assets.wiring.partitions import vnode_key

# a catalog of one's keys (an MV of a folder has its own: `MVAssets`)
_ONE = MVAssets("")
UPSTREAM, REPLICA, MV, PROGRESS = _ONE.upstream, _ONE.replica, _ONE.mv, _ONE.progress


def keeps_replica(report: StepReport, owns_replica: bool) -> bool:
    """Whether the barrier kept `replicated_state`: its mode does (arrangement), or snapshot
    mode took its chunked path (a rate limit or a pause)."""
    return owns_replica or str(report.extra.get("snapshot_path", "")).startswith("chunked")


def record_barrier(log_event: Callable[[object], None], d: MVDefinition, report: StepReport,
                   summary: dict, upstream_version: int, owns_replica: bool,
                   changed: Sequence[int] | None = None, in_backfill: bool = False,
                   keys: MVAssets | None = None) -> None:
    """Log the barrier's per-vnode events, then its summary event (see the module docstring);
    `summary` is the MV-wide metadata (`summary_metadata`). `changed`: the vnodes to record
    (a follower's: those whose progress moved; default every vnode the barrier covered); the
    per-vnode table lists the same vnodes. `in_backfill`: the run belongs to a Dagster
    backfill, which fails on a materialization without a partition: the summary then goes on
    the last finished vnode the barrier covered (it brought that vnode up to date), or is an
    observation while none is finished. `keys`: the MV's (default a catalog of one's)."""
    k = keys or single(d)
    vnodes = report.vnodes if changed is None else changed
    started = [v for v in vnodes if not isinstance(report.progress[v], NotStarted)]
    owned = (k.replica, k.progress) if keeps_replica(report, owns_replica) else (k.progress,)
    for vnode in started:
        meta = _facts(report, vnode)
        for asset in owned:
            log_event(dg.AssetMaterialization(asset, partition=_key(d, vnode), metadata=meta))
    for vnode in started:
        if isinstance(report.progress[vnode], Completed):
            log_event(dg.AssetMaterialization(k.mv, partition=_key(d, vnode),
                                              metadata=_facts(report, vnode)))
    meta = {**summary, "per_vnode": vnode_table(report, vnodes, upstream_version)}
    if not in_backfill:  # the MV as a whole: no partition, so no vnode's status changes, and
        log_event(dg.AssetMaterialization(k.mv, metadata=meta))  # the Overview shows it
        return
    done = [v for v in report.vnodes if isinstance(report.progress[v], Completed)]
    if done:
        log_event(dg.AssetMaterialization(k.mv, partition=_key(d, done[-1]), metadata=meta))
    else:
        log_event(dg.AssetObservation(k.mv, metadata=meta))


def is_summary(metadata) -> bool:
    """Whether an event of `downstream_mv` is a barrier's summary (it has the MV's figures)."""
    return "percent_done" in metadata and "per_vnode" in metadata


def _facts(report: StepReport, vnode: int) -> dict:
    done = isinstance(report.progress[vnode], Completed)
    return {"state": dg.MetadataValue.text("finished" if done else "in progress"),
            "version": dg.MetadataValue.int(report.versions[vnode])}


def _key(d: MVDefinition, vnode: int) -> str:
    return vnode_key(vnode, d.vnode_count)


def summary_metadata(d: MVDefinition, tables: MVTables, report: StepReport, figs: MVFigures,
                     controls: Controls, states: dict[int, str]) -> dict:
    """The MV-wide metadata of a barrier's summary event: state, mode and the MV's live rows
    first (what the Overview leads with), then the figures and what the barrier did."""
    meta = barrier_metadata(report, figs, controls, states)
    return {"state": meta.pop("state"), "mode": dg.MetadataValue.text(d.mode),
            "mv_rows": dg.MetadataValue.int(mv_rows(tables)), **meta}


def mv_rows(tables: MVTables) -> int:
    """Live rows of the MV's latest version, from its log (file row counts less their DVs)."""
    snap = storage.TableVersion.load(tables.mv, None, tables.storage_options)
    return sum(f.live_records or 0 for f in snap.files)
