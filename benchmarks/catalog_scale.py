"""Issue 48's scale figures for a folder catalog: load time, an idle tick, a busy tick.

    flock /tmp/spark.lock python -m benchmarks.catalog_scale [--mvs 50] [--upstreams 5]

1. **Load**: what a code server does on (re)load (import `backfill_assets.definitions`,
   resolve the `Definitions`, build the repository snapshot it serves), each in a fresh
   process, median of three: a catalog of one MV (the file setting and a folder of one) and
   a folder of N MVs over U upstreams (half read an upstream, half read one of those: chains
   of two), beside the bound (at most 1.5x one MV's).
2. **Ticks**: N MVs over U upstreams (tiny tables: the tick's cost is reading each table's
   head and each MV's progress and controls, not rows), backfilled once; then an idle tick
   (median of five; bound 1 s) and, after one commit to every upstream, the tick that starts
   a barrier for every MV (bound 5 s). The flat catalog is used, so one tick reaches every
   MV; in the chained one the readers start one tick later, after their upstream MV's barrier.
3. **Followers** (`--followers N`): the memory of one process with one idle follower of one
   MV, then of one with one follower run serving N idle MVs (benchmarks/catalog_followers.py).
Figures go to stdout and `benchmarks/results/catalog_scale_<N>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = {"primary_key": ["id"], "columns": ["id", "region", "qty"], "vnode_count": 4,
       "chunk_size": 5000}
LOAD = """
import time
t = time.perf_counter()
import backfill_assets.definitions as m
from dagster._core.remote_representation.external_data import RepositorySnap
RepositorySnap.from_def(m.defs.get_repository_def())
print(time.perf_counter() - t)
"""


def write_catalog(folder: str, mvs: int, upstreams: int, chained: bool) -> None:
    """N definitions over U upstream tables; chained: every second MV reads the one before."""
    os.makedirs(folder, exist_ok=True)
    for i in range(mvs):
        reads = f"up{i % upstreams}"
        if chained and i % 2:
            reads = f"mv{i - 1:02d}/downstream_mv"
        body = {**ROW, "upstream": reads, "filter": f"qty > {i % 7}"}
        with open(os.path.join(folder, f"mv{i:02d}.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(body, f)


def load_seconds(env: dict, runs: int = 3) -> float:
    """Median seconds to import, resolve and snapshot the code location, fresh processes."""
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", LOAD], env={**os.environ, **env},
                             cwd=ROOT, capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def load_figures(work: str, mvs: int, upstreams: int) -> dict:
    wh = os.path.join(work, "wh")
    one_file = os.path.join(work, "one.yaml")
    with open(one_file, "w", encoding="utf-8") as f:
        yaml.safe_dump({**ROW, "name": "mv00", "upstream": "up0"}, f)
    write_catalog(os.path.join(work, "one"), 1, 1, chained=False)
    write_catalog(os.path.join(work, "many"), mvs, upstreams, chained=True)
    base = {"BACKFILL_WAREHOUSE": wh, "PYTHONPATH": ROOT}
    out = {
        "file_one_mv_s": load_seconds({**base, "BACKFILL_MV_CONFIG": one_file}),
        "folder_one_mv_s": load_seconds({**base, "BACKFILL_MV_DIR": os.path.join(work, "one")}),
        f"folder_{mvs}_mvs_s": load_seconds({**base,
                                             "BACKFILL_MV_DIR": os.path.join(work, "many")}),
    }
    out["ratio"] = round(out[f"folder_{mvs}_mvs_s"] / out["file_one_mv_s"], 2)
    return out


def tick_figures(work: str, mvs: int, upstreams: int) -> dict:
    """The sensor's ticks over a flat catalog, in this process (as the daemon ticks it)."""
    import dagster as dg

    from backfill_assets.definitions import build_definitions
    from backfill_assets.upstream.writer import LoadParams, run_load
    from resources.settings import load_settings

    wh = os.path.join(work, "ticks_wh")
    folder = os.path.join(work, "flat")
    write_catalog(folder, mvs, upstreams, chained=False)
    for u in range(upstreams):
        run_load(f"{wh}/up{u}", LoadParams(seed=u, initial_rows=200, versions=1,
                                           changes_per_version=10), vnode_count=4)
    settings = load_settings({"BACKFILL_WAREHOUSE": wh, "BACKFILL_MV_DIR": folder})
    defs = build_definitions(settings)
    sensor = defs.get_sensor_def("upstream_barrier_sensor")
    job = defs.get_job_def("backfill_job")
    instance = dg.DagsterInstance.ephemeral()

    def tick() -> tuple[float, list]:
        t = time.perf_counter()
        result = sensor(dg.build_sensor_context(instance=instance))
        return time.perf_counter() - t, [] if isinstance(result, dg.SkipReason) else result

    def run_all(requests) -> float:
        t = time.perf_counter()
        for r in requests:
            assert job.execute_in_process(instance=instance, run_config=r.run_config,
                                          tags=r.tags).success
        return time.perf_counter() - t

    first_s, first = tick()
    backfill_s = run_all(first)
    idle = [tick() for _ in range(5)]
    assert all(not r for _, r in idle), "the catalog is not idle after its backfill"
    for u in range(upstreams):
        run_load(f"{wh}/up{u}", LoadParams(seed=100 + u, versions=1, changes_per_version=10),
                 vnode_count=4)
    busy_s, busy = tick()
    barriers_s = run_all(busy)
    return {"first_tick_s": round(first_s, 3), "first_tick_runs": len(first),
            "backfill_all_s": round(backfill_s, 1),
            "idle_tick_s": round(statistics.median(s for s, _ in idle), 3),
            "busy_tick_s": round(busy_s, 3), "busy_tick_runs": len(busy),
            "barriers_after_commit_s": round(barriers_s, 1)}


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--mvs", type=int, default=50)
    args.add_argument("--upstreams", type=int, default=5)
    args.add_argument("--skip-ticks", action="store_true")
    args.add_argument("--followers", type=int, default=0,
                      help="also the memory of one vs this many idle followers in one process")
    a = args.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="catalog_scale_") as work:
        figures = {"mvs": a.mvs, "upstreams": a.upstreams,
                   "load": load_figures(work, a.mvs, a.upstreams)}
        print(json.dumps(figures["load"]), flush=True)
        if not a.skip_ticks:
            figures["ticks"] = tick_figures(work, a.mvs, a.upstreams)
            print(json.dumps(figures["ticks"]), flush=True)
        if a.followers:
            from benchmarks.catalog_followers import follower_memory

            figures["followers"] = follower_memory(work, a.followers)
            print(json.dumps(figures["followers"]), flush=True)
    out = os.path.join(os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "benchmarks",
                                                                     "results")),
                       f"catalog_scale_{a.mvs}" + ("_followers" if a.followers else "")
                       + ".json")
    figures["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       capture_output=True, text=True).stdout.strip()
    figures["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    with open(out, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=1)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
