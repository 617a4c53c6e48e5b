"""Commit-to-MV latency under `dagster dev`: per-barrier runs and the follower side by side.

    make bench-latency                          # both paths, one commit per 5 s and per 1 s
    .venv/bin/python -m benchmarks.bench_latency --paths continuous --intervals 5 --commits 10

Per path and write rate: `dagster dev` in the background (own DAGSTER_HOME and warehouse;
benchmarks/dagster_dev.py); the default-RUNNING sensor backfills a generated upstream (one
`backfill_job` run per barrier, or with BACKFILL_CONTINUOUS=1 one `follower_job`); then one DML
batch every --interval s, and per upstream commit the time until the first MV commit whose
barrier version includes it (both Delta commit timestamps). Stops after --commits (or
--max-seconds), drains, kills the server's group, and breaks the time down per phase (run
records; the follower's per-barrier events, where the barrier start is its MV commit less its
step_seconds). Run under `flock $BENCH_LOCK` (the Makefile target does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks import common as C
from benchmarks import dagster_dev

PATHS = ("barrier", "continuous")


def _history(uri: str) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(uri).history()


START = ("commit -> barrier start (MV commit - step_seconds; below 0 when the wait is shorter "
         "than the step's work after its MV commit)")


def _mv_commits(mv_uri: str) -> list[tuple[int, float]]:
    """(barrier version, commit time s) of every MV commit made by a step."""
    from backfill_assets.mv.owned_tables import STEP_METADATA_KEY

    if not os.path.exists(os.path.join(mv_uri, "_delta_log")):
        return []
    out = []
    for h in _history(mv_uri):
        raw = h.get(STEP_METADATA_KEY)
        if raw:
            out.append((int(json.loads(raw)["version"]), h["timestamp"] / 1000.0))
    return sorted(out, key=lambda x: x[1])


def _upstream_times(uri: str) -> dict[int, float]:
    return {int(h["version"]): h["timestamp"] / 1000.0 for h in _history(uri)}


def _finished(progress_uri: str, vnode_count: int) -> bool:
    from backfill_assets.mv import owned_tables

    table = owned_tables.open_if_exists(progress_uri, {})
    if table is None:
        return False
    rows = owned_tables.read_rows(table, None, ["backfill_finished"])
    return rows.num_rows == vnode_count and all(rows["backfill_finished"].to_pylist())


def _run_breakdown(instance) -> list[dict]:
    """Per backfill run: barrier version, create/start/end, step start, step seconds."""
    import dagster as dg

    out = []
    for rec in instance.get_run_records(dg.RunsFilter(job_name="backfill_job")):
        run = rec.dagster_run
        cfg = run.run_config.get("ops", {}).get("vnode_backfill", {}).get("config", {})
        step_start = mat = None
        step_seconds = None
        error = None
        for ev in instance.all_logs(run.run_id):
            de = ev.dagster_event
            if de is None:
                continue
            if de.event_type_value in ("STEP_FAILURE", "RUN_FAILURE") and error is None:
                data = de.event_specific_data
                err = getattr(data, "error", None)
                error = (err.message if err is not None else de.message or "").strip()[:300]
            if de.event_type_value == "STEP_START" and step_start is None:
                step_start = ev.timestamp
            meta = _event_metadata(de)
            if step_seconds is None and "step_seconds" in meta:  # the barrier's summary
                step_seconds = meta["step_seconds"].value
            if de.event_type_value == "ASSET_MATERIALIZATION" and mat is None:
                mat = ev.timestamp
        out.append({"run_id": run.run_id, "status": run.status.value,
                    "barrier_version": cfg.get("barrier_version"),
                    "created": rec.create_timestamp.timestamp(),
                    "start": rec.start_time, "end": rec.end_time,
                    "step_start": step_start, "materialized": mat,
                    "step_seconds": step_seconds, "error": error})
    return sorted(out, key=lambda r: r["created"])


def _event_metadata(de) -> dict:
    """The metadata of an asset materialization or observation (else empty)."""
    data = de.event_specific_data
    event = getattr(data, "materialization", None) or getattr(data, "asset_observation", None)
    return dict(event.metadata) if event is not None else {}


def _follower_barriers(instance) -> list[dict]:
    """Per follower barrier: version, step seconds and when Dagster recorded its summary (a
    materialization of the MV without a partition since 55713e1, an observation before)."""
    import dagster as dg
    from dagster._core.events import DagsterEventType

    kinds = {DagsterEventType.ASSET_OBSERVATION, DagsterEventType.ASSET_MATERIALIZATION}
    out = []
    for rec in instance.get_run_records(dg.RunsFilter(job_name="follower_job")):
        for ev in instance.all_logs(rec.dagster_run.run_id, of_type=kinds):
            meta = _event_metadata(ev.dagster_event)
            if "barrier_version" in meta and "step_seconds" in meta:
                out.append({"barrier_version": meta["barrier_version"].value,
                            "step_seconds": meta["step_seconds"].value,
                            "recorded": ev.timestamp})
    return out


def _phases(path: str, instance, commits: list[int], up_times: dict, mv: list) -> dict:
    """Seconds per phase: per barrier run (barrier path) or per follower barrier."""
    if path == "barrier":
        return _run_phases(instance, commits, up_times)
    barriers = {b["barrier_version"]: b for b in _follower_barriers(instance)}
    mv_time = {v: t for v, t in mv}
    parts: dict[str, list[float]] = {
        START: [],
        "barrier (step_seconds: recover, replicate, forward, commit)": [],
        "MV commit -> barrier recorded in Dagster (figures, events)": []}
    for v in commits:
        first = min((bv for bv, _ in mv if bv >= v), default=None)
        if first is None or first not in barriers:
            continue
        start = mv_time[first] - barriers[first]["step_seconds"]
        parts[START].append(start - up_times[v])
    for bv, b in barriers.items():
        if commits and bv >= commits[0] and bv in mv_time:
            parts["barrier (step_seconds: recover, replicate, forward, commit)"].append(
                b["step_seconds"])
            parts["MV commit -> barrier recorded in Dagster (figures, events)"].append(
                b["recorded"] - mv_time[bv])
    return parts


def _run_phases(instance, commits: list[int], up_times: dict) -> dict:
    runs = [r for r in _run_breakdown(instance) if r["barrier_version"] is not None
            and commits and r["barrier_version"] >= commits[0]]
    parts: dict[str, list[float]] = {
        "sensor pickup (newest commit -> run created)": [],
        "queue + launch (created -> run start)": [],
        "run start -> step start (process, code load)": [],
        "step start -> MV materialized (Spark session + barrier)": [],
        "of which barrier (step_seconds)": [], "run total (start -> end)": []}
    for r in runs:
        if r["barrier_version"] in up_times:
            parts["sensor pickup (newest commit -> run created)"].append(
                r["created"] - up_times[r["barrier_version"]])
        if r["start"]:
            parts["queue + launch (created -> run start)"].append(r["start"] - r["created"])
        if r["start"] and r["step_start"]:
            parts["run start -> step start (process, code load)"].append(
                r["step_start"] - r["start"])
        if r["step_start"] and r["materialized"]:
            parts["step start -> MV materialized (Spark session + barrier)"].append(
                r["materialized"] - r["step_start"])
        if r["step_seconds"] is not None:
            parts["of which barrier (step_seconds)"].append(r["step_seconds"])
        if r["start"] and r["end"]:
            parts["run total (start -> end)"].append(r["end"] - r["start"])
    return parts


def _stop_followers(env: dict, proc) -> None:
    """A stop request, so the follower ends SUCCESS instead of being killed with the server."""
    from backfill_assets.barrier.follower import request_stop
    from resources.mv import load_mv_definition, mv_tables
    from resources.settings import load_settings

    if env.get("BACKFILL_CONTINUOUS") == "1" and proc.poll() is None:
        settings = load_settings(env)
        request_stop(mv_tables(load_mv_definition(settings), settings), "benchmark over")
        time.sleep(5)


def measure(args, path: str, interval: float) -> dict:
    """One `dagster dev` session: initial backfill, then commits every `interval` seconds."""
    import dagster as dg

    from backfill_assets.upstream.writer import apply_dml, read_upstream_spec
    from backfill_assets.upstream.writer.load_generator import (
        Generator,
        LoadParams,
        _live_keys,
        run_load,
    )
    from resources.mv import load_mv_definition
    from resources.settings import load_settings

    tmp = tempfile.mkdtemp(prefix=f"bench_latency_{path}_", dir=C.WORK_DIR if os.path.isdir(
        C.WORK_DIR) else None)
    home, wh = os.path.join(tmp, "dagster_home"), os.path.join(tmp, "warehouse")
    uri = os.path.join(wh, "upstream")
    print(f"\n[{path}, one commit per {interval:g} s] upstream {uri}: {args.rows:,} rows, "
          f"{args.vnodes} vnodes", flush=True)
    run_load(uri, LoadParams(seed=3, initial_rows=args.rows, versions=0),
             vnode_count=args.vnodes)
    env = dict(os.environ, DAGSTER_HOME=home, BACKFILL_WAREHOUSE=wh,
               BACKFILL_VNODE_COUNT=str(args.vnodes), BACKFILL_CHUNK_SIZE=str(args.rows),
               BACKFILL_CONTINUOUS="1" if path == "continuous" else "0", PYTHONUNBUFFERED="1")
    env.pop("BACKFILL_MV_CONFIG", None)
    d = load_mv_definition(load_settings(env))
    mv_uri = os.path.join(wh, d.name, "downstream_mv")
    log_path = os.path.join(tmp, "dagster_dev.log")
    started = time.monotonic()
    proc = dagster_dev.start(env, log_path)
    result: dict = {"path": path, "interval": interval, "mv": d.name, "log": log_path}
    commits: list[int] = []
    try:
        deadline = started + args.backfill_timeout
        while not _finished(os.path.join(wh, d.name, "backfill_progress"), args.vnodes):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"initial backfill not finished; see {log_path}")
            time.sleep(1)
        result["initial_backfill_seconds"] = round(time.monotonic() - started, 1)
        time.sleep(args.settle)
        spec = read_upstream_spec(uri)
        live, next_id = _live_keys(uri, None)
        gen, weights = Generator(spec, 3, live, next_id), LoadParams().weights()
        audit, t0 = C.CpuAudit(), time.monotonic()
        next_at = t0
        while len(commits) < args.commits and time.monotonic() - t0 < args.max_seconds:
            if proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited ({proc.returncode}); see {log_path}")
            if time.monotonic() >= next_at:
                batch = gen.batch(len(commits) + 10_000, args.changes, weights)
                commits.append(apply_dml(uri, batch, spec=spec))
                next_at += interval
            time.sleep(0.05)
        drain_end = time.monotonic() + args.drain
        while time.monotonic() < drain_end:
            mv = _mv_commits(mv_uri)
            if mv and max(v for v, _ in mv) >= commits[-1]:
                break
            time.sleep(0.5)
        result["measure_seconds"] = round(time.monotonic() - t0, 1)
        result.update(audit.result())
        if path == "barrier":  # a run still in flight would be interrupted by the stop
            _wait_for_runs(home, "backfill_job", timeout=90)
    finally:
        _stop_followers(env, proc)
        stopped_at = time.time()
        dagster_dev.stop(proc)
    up_times, mv = _upstream_times(uri), _mv_commits(mv_uri)
    latencies, missed = [], []
    for v in commits:
        after = [t for (bv, t) in mv if bv >= v]
        (latencies.append(min(after) - up_times[v]) if after else missed.append(v))
    with dg.DagsterInstance.from_config(home) as instance:
        parts = _phases(path, instance, commits, up_times, mv)
        runs = instance.get_run_records(dg.RunsFilter(job_name=(
            "backfill_job" if path == "barrier" else "follower_job")))
        failed = [r for r in runs if r.dagster_run.status == dg.DagsterRunStatus.FAILURE
                  and (r.end_time or 0) < stopped_at]
        interrupted = [r for r in runs if r.dagster_run.status == dg.DagsterRunStatus.FAILURE
                       and (r.end_time or 0) >= stopped_at]
    result.update({
        "commits": len(commits), "missed_commits": missed,
        "barriers": len([1 for bv, _ in mv if commits and bv >= commits[0]]),
        "latency": C.summary(latencies), "latencies": [round(x, 2) for x in latencies],
        "lag_first_half": C.summary(latencies[: len(latencies) // 2]),
        "lag_second_half": C.summary(latencies[len(latencies) // 2:]),
        "breakdown": {k: C.summary(v) for k, v in parts.items()},
        "runs": len(runs), "failed_runs": len(failed),
        "runs_interrupted_by_the_stop": len(interrupted)})
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _wait_for_runs(home: str, job: str, timeout: float) -> None:
    """Until no run of ``job`` is queued or in progress (or ``timeout``): stopping `dagster
    dev` interrupts a run in flight, which Dagster then records as failed."""
    import dagster as dg

    busy = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
            dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
    end = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(home) as instance:
        while time.monotonic() < end:
            if not instance.get_run_records(dg.RunsFilter(job_name=job, statuses=list(busy))):
                return
            time.sleep(1)


def run(args) -> dict:
    out: dict = {"machine": C.machine_info(), "args": vars(args), "results": []}
    for interval in args.intervals:
        for path in args.paths:
            r = measure(args, path, interval)
            out["results"].append(r)
            print_report(r, args.vnodes)
    path = C.save_results(args.name, out)
    print(f"\nresults: {path}")
    return out


def print_report(r: dict, vnodes: int) -> None:
    lat = r["latency"]
    print(f"\n{r['path']} path, one commit per {r['interval']:g} s, {vnodes} vnodes: "
          f"{r['commits']} commits, {r['barriers']} MV barriers, {r['runs']} runs "
          f"({r['failed_runs']} failed, {r.get('runs_interrupted_by_the_stop', 0)} interrupted "
          f"by the benchmark's stop), {len(r['missed_commits'])} commits never reached the "
          f"MV; {100 * r.get('foreign_cpu_share', 0):.0f}% of the CPU used by other processes")
    if lat.get("n"):
        first, second = r["lag_first_half"], r["lag_second_half"]
        C.print_table(["n", "median s", "p95 s", "min s", "max s", "1st half med", "2nd half med"],
                      [[lat["n"], lat["median"], lat["p95"], lat["min"], lat["max"],
                        first.get("median", "-"), second.get("median", "-")]])
    C.print_table(["phase (seconds)", "n", "median", "p95"],
                  [[k, v["n"], v.get("median", "-"), v.get("p95", "-")]
                   for k, v in r["breakdown"].items()])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--intervals", type=float, nargs="+", default=[5.0, 1.0],
                   help="seconds between upstream commits (one run per rate and path)")
    p.add_argument("--rows", type=int, default=100_000, help="initial upstream rows")
    p.add_argument("--vnodes", type=int, default=256)
    p.add_argument("--changes", type=int, default=20, help="changes per upstream commit")
    p.add_argument("--commits", type=int, default=60, help="upstream commits to measure")
    p.add_argument("--max-seconds", type=float, default=900, help="bound on the measuring")
    p.add_argument("--drain", type=float, default=120, help="wait for the last commits")
    p.add_argument("--settle", type=float, default=20,
                   help="after the initial backfill (its events take seconds at 256 vnodes)")
    p.add_argument("--backfill-timeout", type=float, default=900)
    p.add_argument("--keep", action="store_true", help="keep the temp folder (logs, tables)")
    p.add_argument("--name", default="latency")
    run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
