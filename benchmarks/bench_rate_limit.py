"""The rate limit's promise, measured: no minute above R snapshot rows per second by more than 20%.

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.bench_rate_limit --rate 1000

Two runs over fresh platforms (an upstream of --rows rows, --vnodes vnodes, the demo's MV in
snapshot mode, a chunk size that does not bind, the rate limit set before the first barrier):
- sensor: `dagster dev` with the barrier sensor on, which launches one `backfill_job` run per
  barrier (each a process and a JVM start; a rate-limited barrier steps for a minute);
- follower: one `follower_job` run (`dagster job execute`), barriers back to back.
The progress table's snapshot rows are sampled every --every seconds from the first progress
commit for --seconds; the figures are the rows/s over every 60 s window (sliding by one
sample), over back-to-back minutes (how many are above 120% or below 80% of R) and over the
whole span. Results: benchmarks/results/rate_limit.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time

import yaml

from benchmarks.common import ROOT, WORK_DIR, machine_info, save_results

WINDOW = 60.0


def _platform(kind: str, rows: int, vnodes: int, rate: int) -> dict[str, str]:
    """A fresh platform: warehouse, DAGSTER_HOME, MV definition, upstream, rate limit."""
    base = os.path.join(WORK_DIR, "rate_limit", kind)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "home"))
    shutil.copy(os.path.join(ROOT, "deploy", "dagster.yaml"),
                os.path.join(base, "home", "dagster.yaml"))
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw.update(vnode_count=vnodes, chunk_size=10_000_000)
    mv_yaml = os.path.join(base, "mv.yaml")
    with open(mv_yaml, "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f)
    env = {**os.environ, "BACKFILL_WAREHOUSE": os.path.join(base, "warehouse"),
           "DAGSTER_HOME": os.path.join(base, "home"), "BACKFILL_VNODE_COUNT": str(vnodes),
           "BACKFILL_MV_CONFIG": mv_yaml}
    code = (
        "import os\n"
        "from backfill_assets.mv.controls import Controls, write_controls\n"
        "from backfill_assets.upstream.writer.load_generator import LoadParams, run_load\n"
        "from resources.mv import load_mv_definition, mv_tables\n"
        "from resources.settings import load_settings\n"
        "s = load_settings(); d = load_mv_definition(s)\n"
        f"run_load(s.table_uri('upstream'), LoadParams(seed=3, initial_rows={rows}, "
        f"versions=0), vnode_count={vnodes})\n"
        f"write_controls(mv_tables(d, s), Controls(rate_limit={rate}))\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    return env


def _rows_done(env: dict[str, str]) -> int | None:
    """Snapshot rows done (the progress table's row counts), None before its first commit."""
    code = ("from backfill_assets.mv import tables as m\n"
            "from resources.mv import load_mv_definition, mv_tables\n"
            "from resources.settings import load_settings\n"
            "s = load_settings(); t = mv_tables(load_mv_definition(s), s)\n"
            "p = m.open_table(t.progress, t.storage_options)\n"
            "print(-1 if p is None else sum(x or 0 for x in "
            "m.read_rows(p, None, ['row_count'])['row_count'].to_pylist()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return None if int(out) < 0 else int(out)


def _sample(env: dict[str, str], seconds: float, every: float, start_timeout: float
            ) -> list[tuple[float, int]]:
    """(time, rows done) from the first progress commit on, for `seconds`."""
    deadline = time.monotonic() + start_timeout
    while (rows := _rows_done(env)) is None or rows == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("no barrier committed progress in time")
        time.sleep(every)
    samples, t0 = [(time.monotonic(), rows)], time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(every)
        samples.append((time.monotonic(), _rows_done(env) or 0))
    return samples


def minutes(samples: list[tuple[float, int]]) -> list[float]:
    """Rows/s over back-to-back WINDOW-second windows from the first sample (what a per-minute
    chart of the backfill shows), each between the samples nearest its ends."""
    bounds, t0 = [samples[0]], samples[0][0]
    while True:
        due = t0 + len(bounds) * WINDOW
        last = max((s for s in samples if s[0] <= due + 1e-9), key=lambda s: s[0])
        if due > samples[-1][0] or last is bounds[-1]:
            break
        bounds.append(last)
    return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(bounds, bounds[1:], strict=False)]


def figures(samples: list[tuple[float, int]], rate: int) -> dict:
    """Rows/s over each WINDOW-second window (sliding by one sample, and back to back) and over
    the span; how many back-to-back windows are above or below the limit by more than 20%."""
    windows = []
    for t, rows in samples:
        if t - samples[0][0] < WINDOW:
            continue
        back = max((s for s in samples if s[0] <= t - WINDOW), key=lambda s: s[0])
        windows.append((rows - back[1]) / (t - back[0]))
    span = samples[-1][0] - samples[0][0]
    overall = (samples[-1][1] - samples[0][1]) / span if span else 0.0
    return {"rate_limit": rate, "span_seconds": round(span, 1),
            "rows": samples[-1][1] - samples[0][1], "overall_rows_per_second": round(overall, 1),
            "window_seconds": WINDOW, "windows": len(windows),
            "window_min": round(min(windows), 1) if windows else None,
            "window_mean": round(sum(windows) / len(windows), 1) if windows else None,
            "window_max": round(max(windows), 1) if windows else None,
            "within_20_percent": bool(windows) and all(abs(w - rate) <= 0.2 * rate
                                                       for w in windows),
            "minutes": [round(m, 1) for m in minutes(samples)],
            "minutes_above_120_percent": sum(m > 1.2 * rate for m in minutes(samples)),
            "minutes_below_80_percent": sum(m < 0.8 * rate for m in minutes(samples))}


def sensor_driven(args) -> dict:
    from jobs.dagster_dev import dagster_dev

    env = _platform("sensor", args.rows, args.vnodes, args.rate)
    log = os.path.join(WORK_DIR, "rate_limit", "sensor", "dagster_dev.log")
    with dagster_dev(env, log):
        samples = _sample(env, args.seconds, args.every, start_timeout=300)
    return {**figures(samples, args.rate), "samples": samples}


def follower_driven(args) -> dict:
    env = _platform("follower", args.rows, args.vnodes, args.rate)
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m",
           "backfill_assets.definitions", "-j"]
    log = open(os.path.join(WORK_DIR, "rate_limit", "follower", "follower.log"), "wb")
    proc = subprocess.Popen([*cmd, "follower_job"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        samples = _sample(env, args.seconds, args.every, start_timeout=300)
    finally:
        subprocess.run([*cmd, "stop_follower_job"], cwd=ROOT, env=env, check=False,
                       capture_output=True)
        threading.Thread(target=proc.wait, daemon=True).start()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {**figures(samples, args.rate), "samples": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--vnodes", type=int, default=64)
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--runs", default="sensor,follower")
    p.add_argument("--name", default="rate_limit", help="results file under results/")
    args = p.parse_args(argv)
    result = {"machine": machine_info(), "args": vars(args)}
    for kind in args.runs.split(","):
        result[kind] = (sensor_driven if kind == "sensor" else follower_driven)(args)
        shown = {k: v for k, v in result[kind].items() if k != "samples"}
        print(f"{kind}: {shown}", flush=True)
    save_results(args.name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
