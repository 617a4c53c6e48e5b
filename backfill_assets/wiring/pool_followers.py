"""Continuous mode over a folder: the MVs that need a follower in a tick start as ONE run.

Why: one follower run serving many MVs (barrier/follower_pool.py) holds about the memory of
one follower, a run per MV about as many times more as there are MVs (docs/CATALOG.md,
measured). So each tick the catalog's sensor gathers the MVs that need a follower now, by the
rules a one-MV follower is kept by (`keep_followers`: not stopped on request, no run or
Dagster backfill writing its vnodes, the restart decision with its back-off after failures),
and requests one `follower_job` run `mvs: [...]` for them, in barrier order (the pool runs a
reader's barrier after the barrier of the MV it reads). Its tags say at once which MVs it
follows (`FOLLOWS_TAG`, what liveness counts, queued or running) and which it was started for
(`MV_TAG`, `liveness.pool_tag`: what the restart decision reads after the run ends or an MV
leaves it). An MV that leaves a pool (its error, the run's death) needs a follower again at
the next tick: it joins the next pool of the MVs needing one, or starts alone when it is the
only one. Its own followers, as before, for an MV whose definition says `follower: own` (a
latency-critical MV: a pool runs its MVs' barriers one after another) and for every MV when
the sensor splits MVs into vnode ranges (`BACKFILL_RUN_RANGES` > 1: a pool follows whole MVs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import dagster as dg

from backfill_assets.barrier.follower import stop_request
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.wiring.keys import MVAssets
from backfill_assets.wiring.liveness import (
    FOLLOWER_JOB,
    FOLLOWS_TAG,
    MV_TAG,
    Restart,
    pool_restart,
    pool_tag,
    vnodes_tag,
)
from backfill_assets.wiring.sensors import keep_followers, vnodes_busy

HISTORY = 200  # latest follower runs read per tick: each MV's restart decision reads its 8
OWN = "own"  # `follower: own` in a definition


def keep_catalog_followers(instance: dg.DagsterInstance,
                           stands: Mapping[str, tuple[MVDefinition, MVAssets, MVTables]],
                           ranges: int) -> tuple[list[dg.RunRequest], list[str]]:
    """The follower runs a catalog needs now (`stands`: its MVs in barrier order), and why
    each other MV gets none."""
    requests: list[dg.RunRequest] = []
    reasons: list[str] = []
    pooled = {n: s for n, s in stands.items() if ranges == 1 and s[0].follower != OWN}
    for name, (d, k, tables) in stands.items():
        if name not in pooled:
            result = keep_followers(instance, d, tables, ranges, k)
            if isinstance(result, dg.SkipReason):
                reasons.append(f"{name}: {result.skip_message}")
            else:
                requests.extend(result)
    history = instance.get_run_records(dg.RunsFilter(job_name=FOLLOWER_JOB),
                                       limit=HISTORY) if pooled else []
    starts: dict[str, Restart] = {}
    for name, (d, k, tables) in pooled.items():
        decision = needs_follower(instance, d, tables, k, history)
        if isinstance(decision, str):
            reasons.append(f"{name}: {decision}")
        else:
            starts[name] = decision
    if len(starts) == 1:
        [(name, decision)] = starts.items()
        requests.append(_own_run(stands[name][0], decision))
    elif starts:
        requests.append(pool_run(starts))
    return requests, reasons


def needs_follower(instance: dg.DagsterInstance, d: MVDefinition, tables: MVTables,
                   k: MVAssets, history) -> Restart | str:
    """Whether a pooled MV needs a follower now (the restart to make), or why not."""
    stop = stop_request(tables)
    if stop is not None:
        return (f"followers of MV {d.name!r} stopped on request ({stop['reason']}); "
                "run start_follower_job to start them again")
    busy = vnodes_busy(instance, 0, d.vnode_count - 1, d.vnode_count, k)
    if busy:
        return busy
    decision = pool_restart(history, d.name)
    return decision if decision.start else decision.reason


def pool_run(starts: Mapping[str, Restart]) -> dg.RunRequest:
    """One follower run for the MVs of `starts` (in barrier order). Its run key names each MV
    with the run it replaces, so it never repeats: once launched, every MV's latest run is
    this one, and a later key for it names this run."""
    names = list(starts)
    replaced = "|".join(f"{n}@{starts[n].after_run_id or 'none'}" for n in names)
    digest = hashlib.sha1(replaced.encode()).hexdigest()[:16]
    return dg.RunRequest(
        run_key=f"followers:{len(names)}:{digest}",
        run_config={"ops": {"follow_upstream": {"config": {"mvs": names}}}},
        tags={MV_TAG: pool_tag(names), FOLLOWS_TAG: ",".join(names)})


def _own_run(d: MVDefinition, decision: Restart) -> dg.RunRequest:
    """The one MV needing a follower this tick: a follower of its own, as `keep_followers`
    starts it (a pool of one is the same run with more tags)."""
    last = d.vnode_count - 1
    return dg.RunRequest(
        run_key=f"{d.name}:follower:0-{last}:after:{decision.after_run_id or 'none'}",
        tags={**vnodes_tag(0, last), MV_TAG: d.name})
