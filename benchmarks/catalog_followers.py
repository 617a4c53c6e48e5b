"""Continuous mode's memory for a catalog: one idle follower of one MV against one follower run
serving N idle MVs (the pool, barrier/follower_pool.py), each in a fresh process.

    flock /tmp/spark.lock python -m benchmarks.catalog_scale --followers 50 --skip-ticks

Each figure comes from a child process of its own (a warm JVM from an earlier measurement
would hide what the second one adds): it writes N definitions over one upstream of 200 rows,
starts `follower_job` in a thread (`mv: mv00`, or `mv: all`), waits until every MV's first
barrier has committed, lets the followers idle, then reads the resident set of the process
and of its Spark JVM separately (what is Python's and Dagster's, what is the JVM's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDLE_SECONDS = 5.0  # after the last first barrier: idle passes, the caches at their size


def follower_memory(work: str, followers: int) -> dict:
    """RSS of one idle one-MV follower, and of one pool follower serving `followers` MVs."""
    one = _child(work, "one", 1, pool=False)
    many = _child(work, "pool", followers, pool=True)
    out = {"one_follower_mib": one["total_mib"], "one_follower": one,
           f"pool_{followers}_mib": many["total_mib"], f"pool_{followers}": many}
    out["ratio"] = round(many["total_mib"] / one["total_mib"], 2)
    return out


def _child(work: str, name: str, mvs: int, pool: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-m", "benchmarks.catalog_followers",
                          os.path.join(work, name), str(mvs), "pool" if pool else "one"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"follower child {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(work: str, mvs: int, pool: bool) -> dict:
    """In this (fresh) process: the follower run, its MVs' first barriers, idle, RSS."""
    import dagster as dg

    from backfill_assets.definitions import build_definitions
    from backfill_assets.upstream.writer import LoadParams, run_load
    from benchmarks.catalog_scale import write_catalog
    from benchmarks.measure import descendants, mib, proc_status
    from resources.settings import load_settings

    wh, folder = os.path.join(work, "wh"), os.path.join(work, "mvs")
    write_catalog(folder, mvs, 1, chained=False)
    run_load(f"{wh}/up0", LoadParams(seed=1, initial_rows=200, versions=1,
                                     changes_per_version=10), vnode_count=4)
    defs = build_definitions(load_settings({"BACKFILL_WAREHOUSE": wh,
                                            "BACKFILL_MV_DIR": folder}))
    os.makedirs(os.path.join(work, "home"), exist_ok=True)
    instance = dg.DagsterInstance.local_temp(os.path.join(work, "home"))
    names = [f"mv{i:02d}" for i in range(mvs)]
    config = {"mv": "all" if pool else names[0], "poll_seconds": 0.5}
    run = threading.Thread(target=lambda: defs.get_job_def("follower_job").execute_in_process(
        instance=instance, run_config={"ops": {"follow_upstream": {"config": config}}}),
        daemon=True)
    t0 = time.perf_counter()
    run.start()
    while not all(instance.get_latest_materialization_event(dg.AssetKey([n, "downstream_mv"]))
                  for n in (names if pool else names[:1])):
        if not run.is_alive() or time.perf_counter() - t0 > 600:
            raise RuntimeError("the follower ended (or took 600 s) before every first barrier")
        time.sleep(0.5)
    first_s = time.perf_counter() - t0
    time.sleep(IDLE_SECONDS)
    jvm = sum(proc_status(p, "VmRSS") or 0 for p in descendants(os.getpid()))
    own = proc_status(os.getpid(), "VmRSS") or 0
    defs.get_job_def("stop_follower_job").execute_in_process(
        instance=instance, run_config={"ops": {"request_follower_stop": {"config": {"mv": "all"}}}})
    run.join(120)
    return {"mvs": mvs, "pool": pool, "total_mib": mib(own + jvm), "python_mib": mib(own),
            "jvm_mib": mib(jvm), "first_barriers_s": round(first_s, 1)}


if __name__ == "__main__":
    result = measure(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pool")
    print(json.dumps(result), flush=True)
