"""The demo's barrier rounds over its MVs, and what it reads back from the runs (jobs/demo.py).

A round runs one `backfill_job` barrier per MV in lineage order (an MV after the MVs it reads,
so it takes their commit of the same round), as the barrier sensor would over ticks; rounds
go on until every vnode of every MV is finished, then `maintenance` rounds of pure change-feed
work follow, the writer stopping before the last.
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill_assets.wiring.keys import Served
from backfill_assets.wiring.liveness import MV_TAG


@dataclass
class Totals:
    rounds: int = 0
    snapshot_rows: int = 0
    snapshot_seconds: float = 0.0
    forwarded: int = 0


def mvs_served(definitions) -> Served:
    """The MVs the definitions module serves: its folder catalog, or its one MV."""
    from backfill_assets.wiring.catalog_assets import serve_folder
    from resources.catalog import load_catalog

    if definitions.mv is not None:
        return Served.of_one(definitions.mv)
    return serve_folder(load_catalog(definitions.settings), definitions.settings)[0]


def barrier_rounds(instance, served: Served, writer, maintenance: int, quiet: dict) -> Totals:
    """Rounds until every MV is finished, then `maintenance` more (see the module docstring)."""
    from jobs.workspace_runs import run_in_workspace

    totals, after_finish = Totals(), None
    while after_finish is None or totals.rounds - after_finish < maintenance:
        if after_finish is not None and totals.rounds - after_finish == maintenance - 1:
            writer.stop.set()
            writer.join()
        totals.rounds += 1
        finished = True
        for name in served.names:
            d, k = served.pick(name)
            result = run_in_workspace(instance, "backfill_job", run_config=quiet,
                                      tags={MV_TAG: name})
            meta = observed(result, list(k.mv.path))
            totals.snapshot_rows += meta["rows_read_from_snapshot"]
            if meta["rows_read_from_snapshot"]:
                totals.snapshot_seconds += meta["step_seconds"]
            totals.forwarded += meta["rows_forwarded_from_change_feed"]
            finished &= meta["percent_done"] >= 100.0
            print(f"  round {totals.rounds:>2} {name:<10} @v{meta['barrier_version']:<4} "
                  f"snapshot +{meta['rows_read_from_snapshot']:<7} "
                  f"forwarded {meta['rows_forwarded_from_change_feed']:<5} "
                  f"{meta['percent_done']:5.1f}% done, vnodes finished "
                  f"{meta['vnodes_finished']}/{d.vnode_count}, lag {meta['lag_versions']} "
                  "versions")
        if after_finish is None and finished:
            after_finish = totals.rounds
    return totals


def observed(result, mv_path: list[str]) -> dict:
    """The MV-wide figures of the run's last barrier: its summary event of the MV (a
    materialization, or an observation while no vnode is finished; wiring/events.py)."""
    from backfill_assets.wiring.events import is_summary

    for event in reversed(result.all_events):
        data = event.event_specific_data
        found = getattr(data, "materialization", None) or getattr(data, "asset_observation",
                                                                  None)
        if found is not None and found.asset_key.path == mv_path and \
                is_summary(found.metadata):
            return {k: v.value for k, v in found.metadata.items()}
    raise RuntimeError(f"backfill_job recorded no barrier summary of {'/'.join(mv_path)}")


def verified(result, served: Served) -> dict[str, int]:
    """Rows compared per MV, from the check results verify_job recorded (matches_oracle)."""
    by_key = {served.pick(n)[1].mv: n for n in served.names}
    out = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            out[by_key[data.asset_key]] = data.metadata["rows_compared"].value
    return out
