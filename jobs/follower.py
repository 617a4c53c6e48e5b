"""follower_job (continuous mode) and the two buttons that stop and start it.

    # one long-running run that keeps the MV seconds behind (the sensor starts it when
    # BACKFILL_CONTINUOUS=1; launching it by hand works too)
    dagster job execute -m backfill_assets.definitions -j follower_job
    # stop every follower of the MV after its barrier in flight; stays stopped ...
    dagster job execute -m backfill_assets.definitions -j stop_follower_job
    # ... until started again (the sensor restarts the followers within seconds)
    dagster job execute -m backfill_assets.definitions -j start_follower_job

In a folder catalog each follower runs for the MV its config `mv` (or tag `backfill/mv`)
names, as the sensor launches it; stop_follower_job and start_follower_job take `mv` too
(`mv: all` for every MV).

Terminating a follower run in the UI is a stop request as well (the barrier in flight commits
first; terminate twice to abandon it, which recovery repairs at the next barrier).
"""

import threading

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backfill_assets.barrier.follower import (
    DEFAULT_POLL_SECONDS,
    clear_stop,
    follow,
    request_stop,
    stop_on_interrupt,
)
from backfill_assets.core.errors import FollowerAlreadyRunning
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.step.request import Hook, no_hook
from backfill_assets.wiring.keys import MVChoice, Served, picked, served
from backfill_assets.wiring.liveness import (
    FOLLOWER_JOB,
    MV_TAG,
    run_vnodes,
    vnodes_tag,
    writers_over,
)
from backfill_assets.wiring.named_errors import named_first
from jobs.follower_events import BarrierEmitter
from jobs.follower_pool import follow_pool, pool_names
from resources.mv import mv_tables
from resources.settings import Settings
from resources.warehouse import WarehouseResource


class FollowerConfig(MVChoice):
    """Leave the vnodes unset for the whole MV (or start the run with a `backfill/vnodes` tag,
    "first-last", as the sensor does)."""

    # how often an idle follower re-reads stop requests and controls (it notices a new upstream
    # commit at once: it waits on the next log entry, storage/delta/log_wait.py)
    poll_seconds: float = DEFAULT_POLL_SECONDS
    first_vnode: int | None = None
    last_vnode: int | None = None
    max_barriers: int | None = None  # stop after this many barriers (tests, benchmarks)
    # several MVs in one run (a pool: jobs/follower_pool.py), like `mv: all` for every MV
    mvs: list[str] | None = None


def build_follower_jobs(d: MVDefinition | Served, settings: Settings,
                        hook: Hook = no_hook) -> list[dg.JobDefinition]:
    srv = served(d)
    return [_follower_job(srv, settings, hook), _stop_job(srv, settings),
            _start_job(srv, settings)]


def _follower_job(srv: Served, settings: Settings, hook: Hook) -> dg.JobDefinition:
    @dg.op(name="follow_upstream",
           description="Barrier after barrier on a warm Spark session until stopped.")
    @named_first
    def follow_upstream(context: dg.OpExecutionContext, config: FollowerConfig,
                        spark: LazyPySparkResource, warehouse: WarehouseResource) -> dg.Output:
        names = pool_names(srv, config.mv or context.run.tags.get(MV_TAG), config.mvs)
        if names is not None:
            return follow_pool(context, srv, settings, config, names,
                               spark.spark_session, warehouse.options(), hook)
        [(d, k)] = picked(context, srv, config.mv)
        vnodes = _vnodes(context.run, config, d.vnode_count)
        tables = mv_tables(d, settings, warehouse.options())
        others = [r for r in writers_over(context.instance, vnodes, d.vnode_count, context.run_id,
                                          mv=k.tag_filter)
                  if r.job_name == FOLLOWER_JOB]
        if others:
            raise FollowerAlreadyRunning(
                f"follower run {others[0].run_id} already follows vnodes of "
                f"{vnodes[0]}..{vnodes[-1]}: stop it first (stop_follower_job or Terminate), or, "
                "if its process is gone, let run monitoring mark it failed")
        context.instance.add_run_tags(context.run_id, {**vnodes_tag(vnodes[0], vnodes[-1]),
                                                       MV_TAG: d.name})
        session = spark.spark_session  # before our signal handler: Spark installs its own
        stop = threading.Event()
        emit = BarrierEmitter(context, d, tables, k)
        with stop_on_interrupt(stop, lambda: request_stop(
                tables, f"run {context.run_id} was terminated")):
            summary = follow(session, d, tables, vnodes, on_barrier=emit, stop=stop,
                             poll_seconds=config.poll_seconds, max_barriers=config.max_barriers,
                             log=context.log.warning, hook=hook)
        context.log.info(f"follower stopped ({summary.stopped_by}) after {summary.barriers} "
                         f"barriers, {summary.conflicts} lost races")
        if summary.stopped_by == "interrupt":
            raise dg.DagsterExecutionInterruptedError()
        return dg.Output(summary.barriers, metadata={"barriers": summary.barriers,
                                                     "stopped_by": summary.stopped_by})

    @dg.job(name=FOLLOWER_JOB, executor_def=dg.in_process_executor,
            description="Continuous mode: keeps the MV seconds behind the upstream in one run.")
    def follower_job():
        follow_upstream()

    return follower_job


def _vnodes(run: dg.DagsterRun, config: FollowerConfig, vnode_count: int) -> list[int]:
    if config.first_vnode is None and config.last_vnode is None:
        return list(run_vnodes(run, vnode_count))
    first = config.first_vnode or 0
    last = vnode_count - 1 if config.last_vnode is None else config.last_vnode
    return list(range(first, last + 1))


def _stop_job(srv: Served, settings: Settings) -> dg.JobDefinition:
    @dg.op(name="request_follower_stop")
    @named_first
    def request_follower_stop(context: dg.OpExecutionContext, config: MVChoice,
                              warehouse: WarehouseResource) -> None:
        for d, _ in picked(context, srv, config.mv, allow_all=True):
            request_stop(mv_tables(d, settings, warehouse.options()),
                         f"stop_follower_job run {context.run_id}")
            context.log.info(f"followers of MV {d.name!r} stop after their barrier in flight; "
                             "start_follower_job starts them again")

    @dg.job(name="stop_follower_job", executor_def=dg.in_process_executor,
            description="Stop the MV's followers after their barrier in flight; they stay "
                        "stopped (no restart) until start_follower_job.")
    def stop_follower_job():
        request_follower_stop()

    return stop_follower_job


def _start_job(srv: Served, settings: Settings) -> dg.JobDefinition:
    @dg.op(name="clear_follower_stop")
    @named_first
    def clear_follower_stop(context: dg.OpExecutionContext, config: MVChoice,
                            warehouse: WarehouseResource) -> None:
        for d, _ in picked(context, srv, config.mv, allow_all=True):
            had = clear_stop(mv_tables(d, settings, warehouse.options()))
            context.log.info(f"MV {d.name!r}: "
                             + ("stop request withdrawn" if had else "no stop request was in "
                                "force") + "; the barrier sensor starts the followers at its "
                             "next tick (continuous mode), or launch follower_job")

    @dg.job(name="start_follower_job", executor_def=dg.in_process_executor,
            description="Withdraw a stop request so the sensor (re)starts the followers.")
    def start_follower_job():
        clear_follower_stop()

    return start_follower_job
