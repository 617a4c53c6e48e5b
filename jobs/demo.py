"""`make demo`: the whole product on the embedded default, end to end, over a catalog of five
MVs (`jobs/configs/mvs/`: the row MV `orders_mv`, `big_orders` over it in no_shuffle mode,
`eu_orders` over the same upstream with another filter, the aggregate MV
`revenue_by_region_day` (revenue and orders per region per day, docs/AGGREGATES.md) and the
join MV `revenue_by_segment` (revenue per customer segment and country, orders joined to the
`customers` dimension, docs/JOINS.md); BACKFILL_MV_CONFIG serves one instead).

1. `upstream_load_job` creates an upstream of DEMO_ROWS rows, and the demo the `customers`
   dimension (join/demo_dimension.py) when an MV joins it;
2. a writer keeps committing changes to both (one Delta version per second each) while
3. `backfill_job` runs rounds of barriers, one per MV in lineage order (`big_orders` after
   `orders_mv`, so it reads that round's commit), in this process, on the real Dagster
   instance under DAGSTER_HOME, so every run shows in `dagster dev`, until every vnode of
   every MV is finished,
4. a few more rounds of pure change-feed maintenance follow, the writer stops, one last
   barrier per MV catches up,
5. continuous mode: one `follower_job` run per MV follows a new writer for
   DEMO_CONTINUOUS_SECONDS (15; 0 skips it) on a warm Spark session, then `stop_follower_job`
   (`mv: all`) stops them (and the stop requests are withdrawn, so `BACKFILL_CONTINUOUS=1 make
   ui` starts the followers), and
6. `verify_job` (`mv: all`) recomputes every MV independently and compares row for row.
Every run is executed here but recorded as a run of the workspace's code location
(`jobs.workspace_runs`), so `dagster dev` shows it on the Runs page *and* the Timeline.
A summary is printed at the end. The demo uses its own warehouse folder (./warehouse/demo)
and leaves its settings in `demo.env` (warehouse, vnode count, MV definitions), which `make ui`
loads, so the UI serves the demo's MVs: their groups, partitions, lineage, runs and checks.

`make demo-cluster` (jobs/demo_cluster.py) runs this same script with an object-store
warehouse already set (BACKFILL_WAREHOUSE=s3://..., BACKFILL_STORAGE_OPTIONS) and Spark on a
standalone cluster: then the warehouse is used as given and no demo.env is left (its servers
are gone when it ends).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_ROWS = int(os.environ.get("DEMO_ROWS", "300000"))
DEMO_VNODES = os.environ.get("DEMO_VNODES", "64")
DEMO_ENV = os.path.join(ROOT, "demo.env")  # what `make ui` loads (see Makefile)
MAINTENANCE_BARRIERS = 3
DEMO_MVS = os.path.join(ROOT, "jobs", "configs", "mvs")  # the demo's catalog
CONTINUOUS_SECONDS = int(os.environ.get("DEMO_CONTINUOUS_SECONDS", "15"))
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the UI has the full log


def _remote() -> bool:
    """True when the caller set an object-store warehouse (make demo-cluster)."""
    return "://" in os.environ.get("BACKFILL_WAREHOUSE", "")


def _setup_env() -> str:
    os.environ.setdefault("BACKFILL_VNODE_COUNT", DEMO_VNODES)
    if not os.environ.get("BACKFILL_MV_CONFIG"):  # the caller's one MV, else the catalog
        os.environ.setdefault("BACKFILL_MV_DIR", DEMO_MVS)
    if _remote():
        return os.environ["BACKFILL_WAREHOUSE"]
    warehouse = os.path.join(ROOT, "warehouse", "demo")
    shutil.rmtree(warehouse, ignore_errors=True)
    os.makedirs(warehouse)
    os.environ["BACKFILL_WAREHOUSE"] = warehouse
    os.environ.setdefault("DAGSTER_HOME", os.path.join(ROOT, ".dagster_home"))
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    return warehouse


def _leave_settings() -> None:
    """Write the settings the demo ran with for `make ui`, so the UI's definitions are the
    demo's (same warehouse, vnode count and MVs), not the defaults over ./warehouse."""
    from resources.settings import (
        DEFAULT_MV_CONFIG,
        ENV_MV_CONFIG,
        ENV_MV_DIR,
        ENV_VNODE_COUNT,
        ENV_WAREHOUSE,
        load_settings,
    )

    settings = load_settings()
    values = {ENV_WAREHOUSE: settings.warehouse_root,
              ENV_VNODE_COUNT: str(settings.vnode_count)}
    if settings.mv_dir:
        values[ENV_MV_DIR] = settings.mv_dir
    else:
        values[ENV_MV_CONFIG] = settings.mv_config or DEFAULT_MV_CONFIG
    with open(DEMO_ENV, "w", encoding="utf-8") as f:
        f.write("# written by `make demo`; `make ui` loads it (delete it to serve the defaults)\n")
        f.writelines(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def _forget_old_demo(instance, defs) -> None:
    """The demo recreates its tables, so partition statuses recorded by an earlier demo would
    claim vnodes that no longer exist: wipe the platform assets' history (runs stay), and
    that of an earlier one-MV demo's keys."""
    from backfill_assets.wiring.assets import MV, PROGRESS, REPLICA, UPSTREAM

    instance.wipe_assets([UPSTREAM, REPLICA, MV, PROGRESS,
                          *(k for k in defs.resolve_all_asset_keys()
                            if k not in (UPSTREAM, REPLICA, MV, PROGRESS))])


def _create_upstream(instance) -> None:
    """upstream_load_job, as `dagster job execute ... -j upstream_load_job` would run it."""
    from jobs.workspace_runs import run_in_workspace

    print("upstream_load_job: the upstream table with its first rows")
    run_in_workspace(instance, "upstream_load_job", run_config={**QUIET, "ops": {
        "upstream_load": {"config": {"table": "upstream", "seed": 42,
                                     "initial_rows": DEMO_ROWS, "versions": 0}}}})


class _Writer(threading.Thread):
    """Commits one DML version per second to the upstream until stopped, and one to the
    join MV's `customers` dimension (``dimension``) beside it: both sides of the join move."""

    def __init__(self, uri: str, storage_options: dict | None = None,
                 dimension: str | None = None) -> None:
        super().__init__(daemon=True)
        self.uri, self.stop, self.versions = uri, threading.Event(), 0
        self.storage_options, self.dimension = storage_options or None, dimension

    def run(self) -> None:
        from backfill_assets.join.demo_dimension import write_customers
        from backfill_assets.upstream.writer import LoadParams, run_load

        while not self.stop.is_set():
            run_load(self.uri, LoadParams(seed=1000 + self.versions, versions=1,
                                          changes_per_version=200),
                     storage_options=self.storage_options)
            if self.dimension:
                write_customers(self.dimension, changes=20, seed=1000 + self.versions,
                                storage_options=self.storage_options)
            self.versions += 1
            self.stop.wait(1.0)


def main() -> int:
    _setup_env()
    if not _remote():
        _leave_settings()
    started = time.monotonic()

    import dagster as dg

    from backfill_assets import definitions
    from backfill_assets.join.demo_dimension import demo_customers
    from jobs.demo_continuous import continuous_phase
    from jobs.demo_rounds import barrier_rounds, mvs_served, verified

    served = mvs_served(definitions)
    instance = dg.DagsterInstance.get()
    _forget_old_demo(instance, definitions.defs)
    _create_upstream(instance)
    first = served.pick(served.names[0])[0]
    upstream = _tables(first).upstream
    customers = demo_customers((m, _tables(m)) for m in map(served.definition, served.names))
    writer = _Writer(upstream, dict(_tables(first).storage_options), customers)
    writer.start()
    for name in served.names:
        mv = served.definition(name)
        print(f"MV {mv.name!r} over {_reads(served, name)}, {mv.vnode_count} vnodes, "
              f"{_how(mv)}; keeps the rows with {mv.filter or 'no filter'}")
    print(f"the upstream has {DEMO_ROWS} rows; the writer commits a version every second")
    jvm = _start_spark()
    print(f"Spark session started in {jvm:.1f} s, before the first barrier (so the barriers' "
          "times and the rate below do not include it)")
    totals = barrier_rounds(instance, served, writer, MAINTENANCE_BARRIERS, QUIET)
    if CONTINUOUS_SECONDS > 0:
        continuous_phase(instance, served, _Writer(upstream, dict(_tables(first).storage_options),
                                                   customers), CONTINUOUS_SECONDS, QUIET)
    for name in served.names:  # in lineage order: a reader catches up on its upstream MV
        _catch_up(instance, served, name)
    seconds = time.monotonic() - started
    verify = run_in_workspace_quiet(instance, "verify_job", {"mv": "all"}, "verify_mv")
    rate = totals.snapshot_rows / totals.snapshot_seconds if totals.snapshot_seconds else 0.0
    print(f"\nsummary: {DEMO_ROWS} upstream rows, {len(served.names)} MVs, {writer.versions} "
          f"change versions written during the backfill, {totals.rounds} rounds of one "
          f"barrier per MV ({MAINTENANCE_BARRIERS} of pure change-feed maintenance), "
          f"{seconds:.0f} s in all (Spark's start included); the snapshots: "
          f"{totals.snapshot_rows} rows in {totals.snapshot_seconds:.1f} s of barrier time, "
          f"{rate:,.0f} rows/s; {totals.forwarded} changes forwarded")
    for name, rows in verified(verify, served).items():
        mv = served.definition(name)
        kept = f"the {rows} rows with {mv.filter}" if mv.filter else f"{rows} rows"
        print(f"verify_job: MV {name!r}: verified {kept}, 0 mismatches"
              if verify.success else f"verify_job: MV {name!r}: FAILED")
    where = f"tables under {os.path.dirname(_tables(first).root)}"
    print(where if _remote() else f"{where}; settings for the UI in {DEMO_ENV}: `make ui` "
          "serves these MVs")
    return 0 if verify.success else 1


def run_in_workspace_quiet(instance, job: str, config: dict, op: str):
    """`job` with its op's config, recorded as the workspace's run (its log in the UI)."""
    from jobs.workspace_runs import run_in_workspace

    return run_in_workspace(instance, job, run_config={**QUIET, "ops": {op: {"config": config}}},
                            raise_on_error=False)


def _tables(mv):
    from resources.mv import mv_tables

    return mv_tables(mv)


def _reads(served, name: str) -> str:
    reads = served.catalog.lineage.reads[name] if served.catalog else ()
    return f"the MV {reads[0]!r}" if reads else "the upstream"


def _start_spark() -> float:
    """Start this process's Spark session (the runs' resource gets the same one) and return
    how long it took."""
    from resources.settings import load_settings
    from resources.spark import get_spark

    t = time.monotonic()
    get_spark(load_settings())
    return time.monotonic() - t


def _how(mv) -> str:
    """What one barrier reads, as the MV's mode declares it."""
    from backfill_assets.step.modes import mode_named

    if mode_named(mv.mode).bulk:
        sliced = (f"in slices of about {mv.slice_rows:,} rows" if mv.slice_rows < DEMO_ROWS
                  else f"in one slice (a slice holds up to {mv.slice_rows:,} rows)")
        return (f"{mv.mode} mode: the first barrier reads every row at one pinned version, "
                f"{sliced}, then the change feed keeps it current")
    return f"{mv.mode} mode: {mv.chunk_size} snapshot rows per vnode per barrier"


def _catch_up(instance, served, name: str) -> None:
    """One more barrier when the follower stopped short of its upstream's last version, so the
    demo ends with every MV at its upstream's latest version: `make ui` then has nothing to
    do (its sensor runs no barrier) and shows the demo's verification as it was recorded."""
    from backfill_assets.barrier.runner import controls_in_force, figures
    from backfill_assets.join import barrier_due
    from backfill_assets.wiring.liveness import MV_TAG
    from jobs.workspace_runs import run_in_workspace

    mv = served.definition(name)
    tables = _tables(mv)
    figs = figures(mv, tables, controls_in_force(mv, tables))
    if figs is not None and (figs.lag_versions or (mv.joins and barrier_due(mv, tables))):
        run_in_workspace(instance, "backfill_job", run_config=QUIET, tags={MV_TAG: name})
        print(f"  one more barrier of {name}: it was {figs.lag_versions} versions behind")


if __name__ == "__main__":
    sys.exit(main())
