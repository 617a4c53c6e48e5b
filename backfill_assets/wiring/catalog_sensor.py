"""The barrier sensor of a folder catalog: one sensor for every MV, barriers in lineage order.

Why one sensor: a sensor per MV costs the code location a definition and a snapshot each
(docs/CATALOG.md, measured), and only one place can see the whole lineage. Each tick reads the
head of every table an MV reads (each once) and where every MV stands (its progress table and
controls), then asks which of the MVs with work to do may start (`ready_now`, by the
lineage): none whose upstream MV (directly or through others) has a barrier due or in flight.
So a reader's barrier starts once the barrier of the MV it reads has committed, sees that
commit, and runs once per upstream commit: a chain of three follows an upstream commit in one
pass, tick after tick.

Per MV it then requests what the sensor of a catalog of one would (wiring/sensors.py): a
`backfill_job` run per vnode range, tagged `backfill/mv=<mv>` and `backfill/vnodes`, honouring
the MV's controls (a paused MV gets none once its vnodes are at the upstream's head; a rate
limit applies inside its barrier) and its own liveness. In continuous mode the MVs that need
a follower in a tick start as one follower run serving them all (wiring/pool_followers.py);
an MV with `follower: own`, or every MV when the sensor splits vnode ranges, keeps followers
of its own. A dropped definition is simply not in the catalog any
more: no barrier is requested for it, its tables stay (reset_mv_job removes them).
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

from backfill_assets.core.lineage import Lineage
from backfill_assets.mv import owned_tables
from backfill_assets.wiring.keys import Served
from backfill_assets.wiring.liveness import (
    BACKFILL_JOB,
    FOLLOWER_JOB,
    NEVER_STARTED_AFTER,
    mvs_in_flight,
    pass_over_dead,
)
from backfill_assets.wiring.pool_followers import keep_catalog_followers
from backfill_assets.wiring.sensors import barrier_runs, where
from resources.mv import mv_tables
from resources.settings import Settings


def build_catalog_sensor(served: Served, settings: Settings, ranges: int,
                         never_started_after: float = NEVER_STARTED_AFTER
                         ) -> dg.SensorDefinition:
    """`upstream_barrier_sensor` over every healthy MV of the catalog."""
    target = FOLLOWER_JOB if settings.continuous else BACKFILL_JOB

    @dg.sensor(name="upstream_barrier_sensor", job_name=target, minimum_interval_seconds=5,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Turns each new upstream Delta version into barrier runs of every "
                           "MV it reaches, in lineage order (an MV after the MVs it reads), "
                           "or keeps each MV's followers alive (BACKFILL_CONTINUOUS=1).")
    def upstream_barrier_sensor(context: dg.SensorEvaluationContext):
        for said in pass_over_dead(context.instance, never_started_after):
            context.log.warning(said)
        requests, reasons = catalog_tick(context, served, settings, ranges)
        return requests or dg.SkipReason("; ".join(reasons) or "no MV in the catalog")

    return upstream_barrier_sensor


def catalog_tick(context: dg.SensorEvaluationContext, served: Served, settings: Settings,
                 ranges: int) -> tuple[list[dg.RunRequest], list[str]]:
    """The runs every MV needs now, in barrier order, and why each other MV gets none."""
    heads: dict[str, int | None] = {}
    stands, reasons = {}, []
    for name in served.names:
        d, k = served.pick(name)
        tables = mv_tables(d, settings)
        if tables.upstream not in heads:  # each table read once per tick
            table = owned_tables.open_if_exists(tables.upstream, tables.storage_options)
            heads[tables.upstream] = None if table is None else table.version()
        # continuous: a reader of an MV that is followed too is followed from the start (its
        # follower waits for the table the other's first barrier writes: a chain in one pool)
        unborn = settings.continuous and tables.upstream in {t.mv for _, _, t in stands.values()}
        if heads[tables.upstream] is None and not unborn:
            reasons.append(f"{name}: upstream {tables.upstream} does not exist yet")
            continue
        stands[name] = (d, k, tables)
    if settings.continuous:
        started, why = keep_catalog_followers(context.instance, stands, ranges)
        return started, reasons + why
    requests: list[dg.RunRequest] = []
    wheres = {n: where(d, t, heads[t.upstream]) for n, (d, _, t) in stands.items()}
    due = [n for n, p in wheres.items() if not p.idle]
    reasons += [f"{n}: at its upstream's latest version v{p.version} and "
                + ("paused (resume with set_controls_job)" if p.unfinished else "finished")
                for n, p in wheres.items() if p.idle]
    in_flight = {m for m in mvs_in_flight(context.instance) if m is not None}
    lineage = served.catalog.lineage
    ready = set(ready_now(lineage, due, in_flight))
    for name in due:
        d, k, tables = stands[name]
        if name not in ready:
            reasons.append(_waits(name, lineage, set(due) | in_flight))
            continue
        _collect(barrier_runs(context, d, tables, heads[tables.upstream], ranges, k,
                              wheres[name]), name, requests, reasons)
    return requests, reasons


def ready_now(lineage: Lineage, due: Iterable[str], in_flight: Iterable[str]) -> list[str]:
    """Of the MVs with work to do (`due`, each known from its own tables), those whose
    barrier may start now: not in flight, and no MV they read (directly or through others)
    due or in flight.

    Why not `Lineage.ready` over the due MVs' upstream tables: it counts every reader of a
    moved table as due, so an idle MV beside one being backfilled (same upstream) would hold
    up its own readers for as long as that backfill takes."""
    due, busy = set(due), set(due) | set(in_flight)

    def ancestors(name: str) -> set[str]:
        seen, todo = set(), list(lineage.reads.get(name, ()))
        while todo:
            u = todo.pop()
            if u not in seen:
                seen.add(u)
                todo += lineage.reads.get(u, ())
        return seen

    return [n for n in lineage.order if n in due and n not in set(in_flight)
            and not ancestors(n) & busy]


def _collect(result, name: str, requests: list, reasons: list) -> None:
    if isinstance(result, dg.SkipReason):
        reasons.append(f"{name}: {result.skip_message}")
    else:
        requests.extend(result)


def _waits(name: str, lineage, busy: set[str]) -> str:
    """Why a due MV waits: an MV it reads (directly or through others) is due or running."""
    ahead = [u for u in lineage.order if u != name and u in busy
             and name in lineage.downstream([u])]
    if name in busy and not ahead:
        return f"{name}: its barrier is in flight"
    return f"{name}: waits for the barrier of {', '.join(ahead)} (it reads their output)"
