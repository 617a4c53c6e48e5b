"""Commit-to-MV of a join MV in continuous mode: a commit on either side reaches the MV.

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.follow_join --rows 100000 --commits 4

The demo's join MV (jobs/configs/mvs/revenue_by_segment.yaml: orders left-joined to the
`customers` dimension, then GROUP BY) over a generated upstream of --rows rows and the demo's
dimension (join/demo_dimension.py); its first barrier runs, then the follower's loop
(`barrier.follower.follow`, what `follower_job` runs) follows it on a warm Spark session in a
thread while this process commits --commits times to each side in turn, one commit every
--interval s. Per commit: the time from its Delta commit timestamp to the end of the first
barrier whose version pair includes it (the follower's record, after the progress commit),
as bench_latency.py measures the row MV's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

from benchmarks import common as C

MV_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs",
                       "configs", "mvs", "revenue_by_segment.yaml")


def _commit_time(uri: str, version: int) -> float:
    from deltalake import DeltaTable

    history = DeltaTable(uri).history(limit=5)
    return next(h["timestamp"] / 1000.0 for h in history if int(h["version"]) == version)


def _definition(vnodes: int):
    import yaml

    from backfill_assets.core.mv_definition import MVDefinition

    with open(MV_FILE, encoding="utf-8") as f:
        return MVDefinition.from_dict(yaml.safe_load(f) | {"vnode_count": vnodes})


def measure(args) -> dict:
    """The first barrier, then the commits on both sides under the follower."""
    from backfill_assets.barrier.follower import follow
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.join.demo_dimension import write_customers
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.upstream.writer import LoadParams, run_load

    wh = tempfile.mkdtemp(prefix="follow_join_")
    fact, dim = os.path.join(wh, "upstream"), os.path.join(wh, "customers")
    run_load(fact, LoadParams(seed=3, initial_rows=args.rows, versions=0),
             vnode_count=args.vnodes)
    write_customers(dim)
    d = _definition(args.vnodes)
    tables = MVTables.under(wh, d.name, fact)
    spark, jvm = C.start_spark()
    t0 = time.monotonic()
    run_barrier(spark, d, tables, range(args.vnodes))
    first = time.monotonic() - t0
    ends: list[tuple[float, int, int]] = []
    stop = threading.Event()
    thread = threading.Thread(target=follow, daemon=True, args=(spark, d, tables,
                                                                range(args.vnodes)), kwargs={
        "on_barrier": lambda r: ends.append((time.time(), r.report.v_new,
                                             r.report.extra["dimension_versions"][0])),
        "stop": stop, "poll_seconds": 0.5, "log": print})
    thread.start()
    time.sleep(args.interval)
    commits: list[tuple[str, int, float]] = []
    for i in range(args.commits):
        for side in ("fact", "dimension"):
            if side == "fact":
                v = run_load(fact, LoadParams(seed=100 + i, versions=1,
                                              changes_per_version=200)).last_version
            else:
                v = write_customers(dim, changes=20, seed=100 + i)
            commits.append((side, v, _commit_time(fact if side == "fact" else dim, v)))
            time.sleep(args.interval)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (ends and ends[-1][1] >= commits[-2][1]
                                               and ends[-1][2] >= commits[-1][1]):
        time.sleep(0.2)
    stop.set()
    thread.join(timeout=60)
    return {"rows": args.rows, "vnodes": args.vnodes, "jvm_seconds": round(jvm, 2),
            "first_barrier_seconds": round(first, 2), "barriers": len(ends),
            "commits": [_latency(side, v, at, ends) for side, v, at in commits]}


def _latency(side: str, version: int, at: float, ends: list[tuple[float, int, int]]) -> dict:
    """One commit's way into the MV: the first barrier end whose pair includes it."""
    index = 1 if side == "fact" else 2
    reached = next((e[0] for e in ends if e[index] >= version), None)
    return {"side": side, "version": version,
            "commit_to_mv_seconds": None if reached is None else round(reached - at, 3)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000, help="initial upstream rows")
    p.add_argument("--vnodes", type=int, default=64)
    p.add_argument("--commits", type=int, default=4, help="commits on each side")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between commits")
    result = measure(p.parse_args(argv))
    C.print_table(["side", "version", "commit -> MV (s)"],
                  [(c["side"], c["version"], c["commit_to_mv_seconds"])
                   for c in result["commits"]])
    for side in ("fact", "dimension"):
        values = [c["commit_to_mv_seconds"] for c in result["commits"] if c["side"] == side]
        print(side, C.summary([v for v in values if v is not None]))
    print(C.save_results("follow_join", result | {"code": C.code_version(),
                                                  "machine": C.machine_info()}))


if __name__ == "__main__":
    main()
