"""follower_job for several MVs (`mv: all`, or `mvs: [a, b]`): one run, one follower loop.

    dagster job execute -m backfill_assets.definitions -j follower_job \
        -c jobs/configs/follow_all.yaml

Why one run: N idle one-MV followers hold N runs' contexts and loops (measured in
docs/CATALOG.md); the pool (barrier/follower_pool.py) holds one, and per MV only what is the
MV's. Each MV keeps its own stop request (`stop_follower_job` with its name stops it alone,
the pool keeps serving the others), its controls, its barrier records (the same events and
check results as a one-MV follower's, on its own assets) and its liveness: the run's tag
`backfill/follows` lists the MVs it still follows, so the sensor and the other jobs see each
MV as followed exactly while the pool serves it. An MV whose barrier fails leaves the pool:
its error is logged by name and recorded on its MV asset (an observation with
`follower_error`), it is taken off `backfill/follows` and named in `backfill/failed` (the
sensor's restart back-off counts it), and the others keep following; the run
fails at its end naming every MV that failed.
"""

import threading

import dagster as dg

from backfill_assets.barrier.follower import request_stop, stop_on_interrupt
from backfill_assets.barrier.follower_pool import PoolMember, follow_many
from backfill_assets.core.errors import FollowerAlreadyRunning, InvalidVnode
from backfill_assets.step.request import Hook, no_hook
from backfill_assets.wiring.keys import ALL, Served
from backfill_assets.wiring.liveness import (
    FAILED_TAG,
    FOLLOWER_JOB,
    FOLLOWS_TAG,
    MV_TAG,
    pool_tag,
    writers_over,
)
from jobs.follower_events import BarrierEmitter
from resources.mv import mv_tables
from resources.settings import Settings


def pool_names(srv: Served, mv: str | None, mvs: list[str] | None) -> list[str] | None:
    """The MVs a follower run serves as a pool, in barrier order (an MV after the MVs it
    reads), or None for a one-MV follower. A broken or unknown name refuses the run by name."""
    if mv == ALL:
        return list(srv.names)
    if not mvs:
        return None
    wanted = {srv.pick(n)[0].name for n in mvs}
    return [n for n in srv.names if n in wanted]


def pool_mv_tag(mv: str | None, names: list[str]) -> str:
    """A pool run's `backfill/mv`: "all", or its MVs (`liveness.pool_tag`; the follower itself
    refuses to follow an MV another follower follows)."""
    return ALL if mv == ALL else pool_tag(names)


def follow_pool(context: dg.OpExecutionContext, srv: Served, settings: Settings, config,
                names: list[str], session, options, hook: Hook = no_hook) -> dg.Output:
    """The op body of a pool follower run (config: jobs/follower.py's FollowerConfig;
    `session`: the run's Spark session, taken before the interrupt handler goes in)."""
    if config.first_vnode is not None or config.last_vnode is not None:
        raise InvalidVnode("first_vnode/last_vnode name vnodes of one MV: a follower of "
                           "several MVs follows each whole; unset them, or name one `mv`")
    members = _members(context, srv, settings, names, options)
    state = {"follows": [m.d.name for m in members], "failed": []}

    def left(m: PoolMember) -> None:
        state["follows"] = [n for n in state["follows"] if n != m.d.name]
        if m.error is not None:  # the sensor's restart back-off counts it (liveness.py)
            state["failed"].append(m.d.name)
        context.instance.add_run_tags(context.run_id, {
            FOLLOWS_TAG: ",".join(state["follows"]) or "-",
            **({FAILED_TAG: ",".join(state["failed"])} if state["failed"] else {})})
        if m.error is not None:
            _record_error(context, srv, m)

    # MV_TAG: the run queue's per-MV slot is the pool's own ("all", or its list of MVs)
    named = config.mv or context.run.tags.get(MV_TAG)
    context.instance.add_run_tags(context.run_id, {FOLLOWS_TAG: ",".join(state["follows"]),
                                                   MV_TAG: pool_mv_tag(named, names)})
    stop = threading.Event()
    with stop_on_interrupt(stop, lambda: [request_stop(
            m.tables, f"run {context.run_id} was terminated") for m in members]):
        follow_many(session, members, stop=stop, on_end=left, poll_seconds=config.poll_seconds,
                    max_barriers=config.max_barriers, log=context.log.warning,
                    hook=hook)
    ended = {m.d.name: m.summary for m in members}
    context.log.info("followers stopped: " + "; ".join(
        f"{n} ({s.stopped_by}, {s.barriers} barriers, {s.conflicts} lost races)"
        for n, s in ended.items()))
    failed = [m for m in members if m.error is not None]
    if failed:
        raise dg.Failure(description="; ".join(
            f"MV {m.d.name!r}: {type(m.error).__name__}: {m.error}" for m in failed) +
            " (the other MVs kept following until they stopped)")
    if any(s.stopped_by == "interrupt" for s in ended.values()):
        raise dg.DagsterExecutionInterruptedError()
    return dg.Output(sum(s.barriers for s in ended.values()), metadata={
        "barriers": sum(s.barriers for s in ended.values()), "mvs": len(members),
        "stopped_by": ", ".join(sorted({s.stopped_by for s in ended.values()}))})


def _members(context: dg.OpExecutionContext, srv: Served, settings: Settings,
             names: list[str], options) -> list[PoolMember]:
    """One member per MV not already followed by another run (those are skipped, said)."""
    members, lineage = [], srv.catalog.lineage if srv.catalog is not None else None
    for name in names:
        d, k = srv.pick(name)
        others = [r for r in writers_over(context.instance, range(d.vnode_count), d.vnode_count,
                                          context.run_id, mv=name)
                  if r.job_name == FOLLOWER_JOB]
        if others:
            context.log.warning(f"MV {name!r}: follower run {others[0].run_id} already follows "
                                "it; this run serves the others")
            continue
        tables = mv_tables(d, settings, options)
        reads = tuple(lineage.upstream_tables.get(name, ())[1:]) if lineage else ()
        members.append(PoolMember(d, tables, range(d.vnode_count),
                                  BarrierEmitter(context, d, tables, k, run_tags=False), reads))
    if not members:
        raise FollowerAlreadyRunning(
            f"every MV of {', '.join(names)} is already followed by another follower run: "
            "stop those first (stop_follower_job or Terminate)")
    return members


def _record_error(context: dg.OpExecutionContext, srv: Served, m: PoolMember) -> None:
    """A failed MV's error, by name, in its records: the run's log and its MV asset."""
    err = f"{type(m.error).__name__}: {m.error}"
    context.log.error(f"MV {m.d.name!r} left this follower: {err}. The other MVs keep "
                      "following; fix the cause, then start it again (start_follower_job, "
                      "or the sensor in continuous mode restarts it)")
    context.log_event(dg.AssetObservation(asset_key=srv.keys[m.d.name].mv, metadata={
        "follower_error": err, "follower_run": context.run_id}))
