"""`make demo`: the whole product on the embedded default, end to end.

1. `upstream_load_job` creates an upstream of DEMO_ROWS rows;
2. a writer keeps committing changes to it (one Delta version per second) while
3. `backfill_job` runs barrier after barrier (in this process, on the real Dagster instance
   under DAGSTER_HOME, so every run shows in `dagster dev`) until every vnode is finished,
4. a few more barriers of pure change-feed maintenance follow, the writer stops, one last
   barrier catches up,
5. continuous mode: `follower_job` follows a new writer for DEMO_CONTINUOUS_SECONDS (15; 0
   skips it) in one run on a warm Spark session, then `stop_follower_job` stops it (and the
   stop request is withdrawn, so `BACKFILL_CONTINUOUS=1 make ui` starts a follower), and
6. `verify_job` recomputes the MV independently and compares row for row.
Every run is executed here but recorded as a run of the workspace's code location
(`jobs.workspace_runs`), so `dagster dev` shows it on the Runs page *and* the Timeline.
A summary is printed at the end. The demo uses its own warehouse folder (./warehouse/demo)
and leaves its settings in `demo.env` (warehouse, vnode count, MV definition), which `make ui`
loads, so the UI serves the demo's MV: its partitions, lineage, runs and check results.

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
from collections.abc import Iterator
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_ROWS = int(os.environ.get("DEMO_ROWS", "300000"))
DEMO_VNODES = os.environ.get("DEMO_VNODES", "64")
DEMO_ENV = os.path.join(ROOT, "demo.env")  # what `make ui` loads (see Makefile)
MAINTENANCE_BARRIERS = 3
CONTINUOUS_SECONDS = int(os.environ.get("DEMO_CONTINUOUS_SECONDS", "15"))
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the UI has the full log


def _remote() -> bool:
    """True when the caller set an object-store warehouse (make demo-cluster)."""
    return "://" in os.environ.get("BACKFILL_WAREHOUSE", "")


def _setup_env() -> str:
    os.environ.setdefault("BACKFILL_VNODE_COUNT", DEMO_VNODES)
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
    demo's (same warehouse, vnode count and MV), not the defaults over ./warehouse."""
    from resources.mv import DEFAULT_MV_CONFIG
    from resources.settings import ENV_MV_CONFIG, ENV_VNODE_COUNT, ENV_WAREHOUSE, load_settings

    settings = load_settings()
    values = {ENV_WAREHOUSE: settings.warehouse_root,
              ENV_VNODE_COUNT: str(settings.vnode_count),
              ENV_MV_CONFIG: settings.mv_config or DEFAULT_MV_CONFIG}
    with open(DEMO_ENV, "w", encoding="utf-8") as f:
        f.write("# written by `make demo`; `make ui` loads it (delete it to serve the defaults)\n")
        f.writelines(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def _forget_old_demo(instance) -> None:
    """The demo recreates its tables, so partition statuses recorded by an earlier demo would
    claim vnodes that no longer exist: wipe the platform assets' history (runs stay)."""
    from backfill_assets.wiring.assets import MV, PROGRESS, REPLICA, UPSTREAM

    instance.wipe_assets([UPSTREAM, REPLICA, MV, PROGRESS])


def _create_upstream(instance) -> None:
    """upstream_load_job, as `dagster job execute ... -j upstream_load_job` would run it."""
    from jobs.workspace_runs import run_in_workspace

    print("upstream_load_job: the upstream table with its first rows")
    run_in_workspace(instance, "upstream_load_job", run_config={**QUIET, "ops": {
        "upstream_load": {"config": {"table": "upstream", "seed": 42,
                                     "initial_rows": DEMO_ROWS, "versions": 0}}}})


class _Writer(threading.Thread):
    """Commits one DML version per second to the upstream until stopped."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.uri, self.stop, self.versions = uri, threading.Event(), 0
        self.storage_options = storage_options or None

    def run(self) -> None:
        from backfill_assets.upstream.writer import LoadParams, run_load

        while not self.stop.is_set():
            run_load(self.uri, LoadParams(seed=1000 + self.versions, versions=1,
                                          changes_per_version=200),
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
    from jobs.workspace_runs import run_in_workspace
    from resources.mv import mv_tables

    mv = definitions.mv
    instance = dg.DagsterInstance.get()
    _forget_old_demo(instance)
    _create_upstream(instance)
    tables = mv_tables(mv)
    writer = _Writer(tables.upstream, dict(tables.storage_options))
    writer.start()
    print(f"MV {mv.name!r} over {DEMO_ROWS} upstream rows, {mv.vnode_count} vnodes, "
          f"{_how(mv)}; keeps the rows with {mv.filter or 'no filter'}; "
          "the writer commits a version every second")
    jvm = _start_spark()
    print(f"Spark session started in {jvm:.1f} s, before the first barrier (so the barriers' "
          "times and the rate below do not include it)")
    barriers, snapshot_rows, forwarded, after_finish = 0, 0, 0, None
    snapshot_seconds = 0.0
    while after_finish is None or barriers - after_finish < MAINTENANCE_BARRIERS:
        if after_finish is not None and barriers - after_finish == MAINTENANCE_BARRIERS - 1:
            writer.stop.set()
            writer.join()
        result = run_in_workspace(instance, "backfill_job", run_config=QUIET)
        meta = _observed(result)
        barriers += 1
        snapshot_rows += meta["rows_read_from_snapshot"]
        if meta["rows_read_from_snapshot"]:
            snapshot_seconds += meta["step_seconds"]
        forwarded += meta["rows_forwarded_from_change_feed"]
        print(f"  barrier {barriers:>2} @v{meta['barrier_version']:<4} "
              f"snapshot +{meta['rows_read_from_snapshot']:<7} "
              f"forwarded {meta['rows_forwarded_from_change_feed']:<5} "
              f"{meta['percent_done']:5.1f}% done, vnodes finished {meta['vnodes_finished']}/"
              f"{mv.vnode_count}, lag {meta['lag_versions']} versions")
        if after_finish is None and meta["percent_done"] >= 100.0:
            after_finish = barriers
    _continuous_phase(instance, tables)
    _catch_up(instance, mv, tables)
    seconds = time.monotonic() - started
    verify = run_in_workspace(instance, "verify_job", run_config=QUIET, raise_on_error=False)
    rows = _checked(verify).get("rows_compared", 0)
    rate = snapshot_rows / snapshot_seconds if snapshot_seconds else 0.0
    print(f"\nsummary: {DEMO_ROWS} upstream rows, {writer.versions} change versions written "
          f"during the backfill, {barriers} barriers ({MAINTENANCE_BARRIERS} of pure change-feed "
          f"maintenance), {seconds:.0f} s in all (Spark's start included); the snapshot: "
          f"{snapshot_rows} rows in {snapshot_seconds:.1f} s of barrier time, {rate:,.0f} "
          f"rows/s; {forwarded} changes forwarded")
    kept = f"the {rows} rows with {mv.filter}" if mv.filter else f"{rows} rows"
    verdict = f"verified {kept} (the MV's filter), 0 mismatches" if verify.success \
        else "FAILED"
    print(f"verify_job: {verdict}")
    where = f"tables under {tables.root}"
    print(where if _remote() else f"{where}; settings for the UI in {DEMO_ENV}: `make ui` "
          "serves this MV")
    return 0 if verify.success else 1


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


def _continuous_phase(instance, tables) -> None:
    """Continuous mode (README): one follower_job run on a warm Spark session follows a writer
    committing every second for CONTINUOUS_SECONDS, then stop_follower_job stops it."""
    from backfill_assets.barrier.follower import clear_stop
    from jobs.workspace_runs import run_in_workspace

    if CONTINUOUS_SECONDS <= 0:
        return
    print(f"\ncontinuous mode: follower_job follows a writer for {CONTINUOUS_SECONDS} s")
    result = {}
    config = {**QUIET, "ops": {"follow_upstream": {"config": {"poll_seconds": 0.5}}}}
    thread = threading.Thread(target=lambda: result.update(run=run_in_workspace(
        instance, "follower_job", run_config=config, raise_on_error=False)), daemon=True)
    writer = _Writer(tables.upstream, dict(tables.storage_options))
    with _stdout_kept():
        thread.start()
        writer.start()
        _show_follower(instance)
        writer.stop.set()
        writer.join()
        time.sleep(2)  # let the follower take the writer's last version
        run_in_workspace(instance, "stop_follower_job", run_config=QUIET)
        thread.join()
    # the stop request stays in force until withdrawn: withdraw it, so `BACKFILL_CONTINUOUS=1
    # make ui` starts a follower with that setting alone (start_follower_job does the same)
    clear_stop(tables)
    print(f"  follower stopped on request: {'ok' if result['run'].success else 'FAILED'}; "
          "stop request withdrawn")


@contextmanager
def _stdout_kept() -> Iterator[None]:
    """Two runs at once in this process (the follower in a thread, stop_follower_job here)
    each redirect fds 1 and 2 into their compute log and put back what they found. When the
    follower's run ends first, stop_follower_job puts back the follower's (finished) capture
    and everything printed after it is lost (the demo once ended silently, exit 0, without its
    verdict). So the fds found here are put back here, whatever order the runs end in."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _show_follower(instance) -> None:
    """One line per follower barrier, from the run's tags, for CONTINUOUS_SECONDS."""
    import dagster as dg

    deadline, shown = time.monotonic() + CONTINUOUS_SECONDS, None
    while time.monotonic() < deadline:
        time.sleep(1)
        runs = instance.get_runs(dg.RunsFilter(job_name="follower_job"), limit=1)
        tags = runs[0].tags if runs else {}
        if tags.get("follower/barriers") not in (None, shown):
            shown = tags["follower/barriers"]
            print(f"  follower barrier {shown:>3} @v{tags['follower/version']:<4} lag "
                  f"{tags['follower/lag_versions']} versions / {tags['follower/lag_seconds']} s",
                  flush=True)


def _catch_up(instance, mv, tables) -> None:
    """One more barrier when the follower stopped short of the writer's last version, so the
    demo ends with the MV at the upstream's latest version: `make ui` then has nothing to do
    (its sensor runs no barrier) and shows the demo's verification as it was recorded."""
    from backfill_assets.barrier.runner import controls_in_force, figures
    from jobs.workspace_runs import run_in_workspace

    figs = figures(mv, tables, controls_in_force(mv, tables))
    if figs is not None and figs.lag_versions:
        run_in_workspace(instance, "backfill_job", run_config=QUIET)
        print(f"  one more barrier: the MV was {figs.lag_versions} versions behind")


def _observed(result) -> dict:
    """The MV-wide figures of the run's last barrier: its summary event of downstream_mv (a
    materialization, or an observation while no vnode is finished; wiring/events.py)."""
    from backfill_assets.wiring.events import is_summary

    for event in reversed(result.all_events):
        data = event.event_specific_data
        found = getattr(data, "materialization", None) or getattr(data, "asset_observation",
                                                                  None)
        if found is not None and found.asset_key.path == ["downstream_mv"] and \
                is_summary(found.metadata):
            return {k: v.value for k, v in found.metadata.items()}
    raise RuntimeError("backfill_job recorded no barrier summary")


def _checked(result) -> dict:
    """The metadata of the asset check result a run recorded (verify_job: matches_oracle)."""
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            return {k: v.value for k, v in event.event_specific_data.metadata.items()}
    return {}


if __name__ == "__main__":
    sys.exit(main())
