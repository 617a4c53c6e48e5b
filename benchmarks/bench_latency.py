"""Commit-to-MV latency under `dagster dev` with the barrier sensor running.

    make bench-latency
    .venv/bin/python -m benchmarks.bench_latency --barriers 20 --interval 5 --max-seconds 600

Starts `dagster dev -w workspace.yaml` in the background (temporary DAGSTER_HOME and
BACKFILL_WAREHOUSE, a small vnode count, default signal handlers restored, own process group),
lets the default-RUNNING `upstream_barrier_sensor` backfill a generated upstream, then commits
one DML batch to the upstream every --interval seconds and measures, for every upstream
commit, the time until the first MV commit whose barrier version includes it (both from the
Delta logs' commit timestamps). Stops after --barriers MV commits (or --max-seconds), waits
--drain seconds for the last commits, always kills the server's process group, and breaks
each barrier's run down with Dagster's own run records (sensor pickup, queue + launch, run
process start, step = Spark session + barrier). Run it under `flock $BENCH_LOCK` (the
Makefile target does): every Dagster run starts a Spark JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchmarks import common as C


def _restore_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _history(uri: str) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(uri).history()


def _mv_commits(mv_uri: str) -> list[tuple[int, float]]:
    """(barrier version, commit time s) of every MV commit made by a step."""
    from backfill_assets.mv_store import STEP_METADATA_KEY

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
    from backfill_assets import mv_store

    table = mv_store.open_table(progress_uri, {})
    if table is None:
        return False
    rows = mv_store.read_rows(table, None, ["backfill_finished"])
    return rows.num_rows == vnode_count and all(rows["backfill_finished"].to_pylist())


def _stop(proc: subprocess.Popen) -> None:
    """Kill dagster dev and everything it started (daemon, code server, runs, JVMs)."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.getpgid(int(pid)) == pgid:
                    return True
            except (ProcessLookupError, PermissionError):
                continue
    return False


def _run_breakdown(home: str) -> list[dict]:
    """Per backfill run: barrier version, create/start/end, step start, step seconds."""
    import dagster as dg

    os.environ["DAGSTER_HOME"] = home
    out = []
    with dg.DagsterInstance.get() as instance:
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
                if de.event_type_value == "ASSET_MATERIALIZATION" and mat is None:
                    mat = ev.timestamp
                    meta = de.event_specific_data.materialization.metadata
                    if "step_seconds" in meta:
                        step_seconds = meta["step_seconds"].value
            out.append({"run_id": run.run_id, "status": run.status.value,
                        "barrier_version": cfg.get("barrier_version"),
                        "created": rec.create_timestamp.timestamp(),
                        "start": rec.start_time, "end": rec.end_time,
                        "step_start": step_start, "materialized": mat,
                        "step_seconds": step_seconds, "error": error})
    return sorted(out, key=lambda r: r["created"])


def run(args) -> dict:
    from backfill_assets.load_generator import Generator, LoadParams, _live_keys, run_load
    from backfill_assets.upstream import apply_dml, read_upstream_spec

    tmp = tempfile.mkdtemp(prefix="bench_latency_", dir=C.WORK_DIR if os.path.isdir(
        C.WORK_DIR) else None)
    home, wh = os.path.join(tmp, "dagster_home"), os.path.join(tmp, "warehouse")
    os.makedirs(home)
    with open(os.path.join(home, "dagster.yaml"), "w", encoding="utf-8") as f:
        f.write("telemetry:\n  enabled: false\n")
    uri = os.path.join(wh, "upstream")
    print(f"creating upstream {uri}: {args.rows:,} rows, {args.vnodes} vnodes", flush=True)
    run_load(uri, LoadParams(seed=3, initial_rows=args.rows, versions=0),
             vnode_count=args.vnodes)
    from resources.mv import load_mv_definition
    from resources.settings import load_settings

    env = dict(os.environ, DAGSTER_HOME=home, BACKFILL_WAREHOUSE=wh,
               BACKFILL_VNODE_COUNT=str(args.vnodes), BACKFILL_CHUNK_SIZE=str(args.rows),
               PYTHONUNBUFFERED="1")
    env.pop("BACKFILL_MV_CONFIG", None)
    d = load_mv_definition(load_settings(env))
    mv_uri = os.path.join(wh, d.name, "downstream_mv")
    progress_uri = os.path.join(wh, d.name, "backfill_progress")
    log_path = os.path.join(tmp, "dagster_dev.log")
    port = _free_port()
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
           "-p", str(port)]
    print("$ " + " ".join(cmd[2:]) + f"   (log {log_path})", flush=True)
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=C.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_restore_signals)
    result: dict = {"machine": C.machine_info(), "args": vars(args), "mv": d.name}
    try:
        deadline = started + args.backfill_timeout
        while not _finished(progress_uri, args.vnodes):
            if proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited ({proc.returncode}); see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"initial backfill not finished after "
                                   f"{args.backfill_timeout}s; see {log_path}")
            time.sleep(1)
        result["initial_backfill_seconds"] = round(time.monotonic() - started, 1)
        print(f"initial backfill finished {result['initial_backfill_seconds']}s after start",
              flush=True)
        time.sleep(args.settle)

        spec = read_upstream_spec(uri)
        live, next_id = _live_keys(uri, None)
        gen = Generator(spec, 3, live, next_id)
        weights = LoadParams().weights()
        commits: list[int] = []
        first_mv = len(_mv_commits(mv_uri))
        audit = C.CpuAudit()
        t_measure = time.monotonic()
        next_at = t_measure
        while True:
            now = time.monotonic()
            done = len(_mv_commits(mv_uri)) - first_mv
            if done >= args.barriers or now - t_measure > args.max_seconds:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited ({proc.returncode}); see {log_path}")
            if now >= next_at:
                v = apply_dml(uri, gen.batch(len(commits) + 10_000, args.changes, weights),
                              spec=spec)
                commits.append(v)
                next_at += args.interval
                print(f"  upstream commit v{v}; MV barriers so far {done}", flush=True)
            time.sleep(0.2)
        # drain: wait for the MV to include the last commit
        drain_end = time.monotonic() + args.drain
        while time.monotonic() < drain_end:
            mv = _mv_commits(mv_uri)
            if mv and max(v for v, _ in mv) >= commits[-1]:
                break
            time.sleep(1)
        result["measure_seconds"] = round(time.monotonic() - t_measure, 1)
        result.update(audit.result())
    finally:
        _stop(proc)
        log.close()
    up_times = _upstream_times(uri)
    mv = _mv_commits(mv_uri)
    latencies, missed = [], []
    for v in commits:
        after = [t for (bv, t) in mv if bv >= v]
        if after:
            latencies.append(min(after) - up_times[v])
        else:
            missed.append(v)
    barriers = [(bv, t) for (bv, t) in mv if bv >= commits[0]] if commits else []
    runs = _run_breakdown(home)
    measured_runs = [r for r in runs if r["barrier_version"] is not None
                     and commits and r["barrier_version"] >= commits[0]]
    parts = {"sensor pickup (newest commit -> run created)": [],
             "queue + launch (created -> run start)": [],
             "run start -> step start (process, code load)": [],
             "step start -> MV materialized (Spark session + barrier)": [],
             "of which barrier (step_seconds)": [],
             "run total (start -> end)": []}
    for r in measured_runs:
        v = r["barrier_version"]
        if v in up_times:
            parts["sensor pickup (newest commit -> run created)"].append(r["created"] - up_times[v])
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
    result.update({
        "commits": len(commits), "barriers": len(barriers), "missed_commits": missed,
        "latency": C.summary(latencies), "latencies": [round(x, 2) for x in latencies],
        "breakdown": {k: C.summary(v) for k, v in parts.items()},
        "runs": len(runs), "failed_runs": sum(1 for r in runs if r["status"] == "FAILURE"),
        "failures": [r["error"] for r in runs if r["status"] == "FAILURE"],
        "log": log_path,
    })
    print_report(result)
    path = C.save_results(args.name, result)
    print(f"\nresults: {path}")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def print_report(r: dict) -> None:
    lat = r["latency"]
    print(f"\nCommit-to-MV latency under dagster dev ({r['commits']} upstream commits every "
          f"{r['args']['interval']}s, {r['barriers']} barriers, {r['args']['vnodes']} vnodes, "
          f"{r['runs']} runs, {r['failed_runs']} failed, "
          f"{len(r['missed_commits'])} commits never reached the MV; "
          f"{100 * r.get('foreign_cpu_share', 0):.0f}% of the CPU used by other processes)")
    if lat.get("n"):
        C.print_table(["n", "median s", "p95 s", "min s", "max s"],
                      [[lat["n"], lat["median"], lat["p95"], lat["min"], lat["max"]]])
    for error in r.get("failures", []):
        print(f"failed run: {error}")
    print("\nPer barrier run (seconds)")
    C.print_table(["part", "n", "median", "p95"],
                  [[k, v["n"], v.get("median", "-"), v.get("p95", "-")]
                   for k, v in r["breakdown"].items()])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000, help="initial upstream rows")
    p.add_argument("--vnodes", type=int, default=16)
    p.add_argument("--changes", type=int, default=20, help="changes per upstream commit")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between commits")
    p.add_argument("--barriers", type=int, default=20, help="MV barriers to measure")
    p.add_argument("--max-seconds", type=float, default=600, help="bound on the measuring")
    p.add_argument("--drain", type=float, default=90, help="wait for the last commits")
    p.add_argument("--settle", type=float, default=5)
    p.add_argument("--backfill-timeout", type=float, default=300)
    p.add_argument("--keep", action="store_true", help="keep the temp folder (logs, tables)")
    p.add_argument("--name", default="latency")
    run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
