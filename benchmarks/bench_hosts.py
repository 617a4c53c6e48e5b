"""The billion-row plan's check point: a snapshot backfill of N rows on hosts of their own.

    flock /tmp/spark.lock env PYTHONPATH=. python -m benchmarks.bench_hosts --rows 100000000

Why: docs/SCALE_OUT.md plans a billion-row backfill from per-row costs measured on the loopback
cluster (bulk rows/s per executor core, change rows/s per barrier); this runs the same backfill
where nothing is shared but the network (tests/infra/hosts.py: the S3 server, the Spark master,
two one-core workers, the writer and the driver each on a host of its own) and reports the
same costs, so the plan's prediction can be checked against them. Root and network namespaces
are needed (as tests/scale/test_hosts.py).

The steps, each timed: the upstream written by the load generator on the writer host (a
compact schema by default, ``SCHEMAS``); the bulk barrier (every vnode to finished in one run);
an idle run (nothing new: a run's fixed cost); ``--changes`` new keys appended on the writer
host in five versions and the catch-up barrier that applies them. A
barrier's own time runs from its plan to its last progress commit, as the run's progress
lines give it (a run's wall time adds Dagster's start and the Spark session's). Exactness:
the MV's rows and sum of ids against the upstream's filtered rows, counted by delta-rs's query
engine on the writer host (no Spark). The S3 server's resident memory is read after each step.
Results: benchmarks/results/hosts_<schema>_<rows>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time

from tests.infra.host_cluster import WORKER_CORES, start_host_cluster
from tests.infra.host_runs import TASKS, VNODES, Deployment, finished
from tests.infra.hosts import Host, Network

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# schema -> (upstream columns, MV fields replaced in jobs/configs/mv.yaml). compact: 4 narrow
# columns, so 100M rows fit the in-memory store; demo: the load generator's every column and
# the default MV (the rows the plan's loopback figures were measured on)
SCHEMAS = {
    "compact": (["region", "id", "qty", "flag"],
                {"columns": ["id", "region", "qty"], "filter": "qty > 0 AND NOT flag",
                 "computed": [{"name": "qty2", "expr": "qty * 2"}]}),
    "demo": (None, {}),
}
WHERE = "qty > 0 AND NOT flag"


def _rss_mib(host: Host) -> float:
    """The resident memory of every process on ``host`` (the S3 server's), MiB."""
    total = 0
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            continue
    return round(total / 1024, 1)


def _timed_run(dep: Deployment, driver: Host, conf: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    server = dep.start_run(driver, spark_conf=conf)
    code = finished(server, 7200)
    out = server.log_tail(10**7)
    assert code == 0 and "RUN_SUCCESS" in out, out[-5000:]
    return time.monotonic() - start, out


def _barrier_lines(out: str) -> list[str]:
    return re.findall(r"barrier v\d+ vnodes [^\n]*", out)


def _work_s(out: str) -> float:
    """The barrier's own time in a run: from its plan (the Spark session started, progress
    recovered) to its last progress commit, as the run's progress lines say (assets.py)."""
    planned = re.findall(r"step planned \((\d+\.\d+) s\)", out)
    committed = re.findall(r"backfill_progress committed \((\d+\.\d+) s\)", out)
    return round(float(committed[-1]) - float(planned[0]), 2)


def _load(dep: Deployment, columns: list[str] | None, **params) -> tuple[float, dict]:
    start = time.monotonic()
    got = dep.load(timeout=3600, **params, columns=columns)
    return time.monotonic() - start, got


def _append(cluster, dep: Deployment, rows: int, changes: int) -> tuple[float, dict]:
    """``changes`` new keys in 5 versions (appends: the load generator's DML scans every live
    key, which 100M keys do not fit)."""
    start = time.monotonic()
    out = cluster.writer.python(TASKS, "append", dep.upstream, json.dumps(
        {"seed": 4, "start": rows, "count": changes, "versions": 5}),
        env=cluster.store_env(), timeout=3600)
    return time.monotonic() - start, json.loads(out.strip().splitlines()[-1])


def run(out: dict, rows: int, changes: int, executor_memory: str, schema: str) -> None:
    """The steps (module docstring), each figure into ``out`` as it is measured (a failed
    step leaves those before it recorded)."""
    out.update({"rows": rows, "changes": changes, "workers": 2, "cores_per_worker": WORKER_CORES,
                "vnodes": VNODES, "schema": schema, "executor_memory": executor_memory})
    columns, mv = SCHEMAS[schema]
    base = tempfile.mkdtemp(prefix="bench-hosts-")
    net = Network(os.path.join(base, "hosts"))
    try:
        cluster = start_host_cluster(net, workers=2, drivers=1)
        driver = cluster.drivers[0]
        dep = Deployment(cluster, "snapshot", mv=mv)
        conf = {"spark.executor.memory": executor_memory, "spark.driver.memory": "1g"}
        out["load_s"], out["load"] = _load(dep, columns, seed=3, initial_rows=rows, versions=0,
                                           changes_per_version=0, load_batch=2_000_000)
        out["store_mib_after_load"] = _rss_mib(cluster.s3)
        out["bulk_run_s"], bulk = _timed_run(dep, driver, conf)
        out["bulk_barriers"], out["bulk_s"] = _barrier_lines(bulk), _work_s(bulk)
        out["store_mib_after_bulk"] = _rss_mib(cluster.s3)
        out["idle_run_s"], _ = _timed_run(dep, driver, conf)  # the fixed cost of a run
        out["dml_s"], out["dml"] = _append(cluster, dep, rows, changes)
        out["catch_up_run_s"], catch = _timed_run(dep, driver, conf)
        out["catch_up_barriers"], out["catch_up_s"] = _barrier_lines(catch), _work_s(catch)
        out["store_mib_at_end"] = _rss_mib(cluster.s3)
        got = json.loads(cluster.writer.python(
            TASKS, "counts", dep.upstream, f"{dep.warehouse}/orders_mv/downstream_mv", WHERE,
            env=cluster.store_env(), timeout=3600).strip().splitlines()[-1])
        out["counts"] = got
        out["exact"] = got["upstream"]["n"] == got["mv"]["n"] and \
            got["upstream"]["ids"] == got["mv"]["ids"]
        out["bulk_rows_per_s_per_core"] = round(rows / out["bulk_s"] / (2 * WORKER_CORES))
        out["change_rows_per_s"] = round(changes / max(out["catch_up_s"], 1e-3))
    finally:
        net.close()
        if "exact" in out:  # a failed run keeps its hosts' folders and logs to be read
            shutil.rmtree(base, ignore_errors=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--changes", type=int, default=100_000)
    p.add_argument("--executor-memory", default="768m")
    p.add_argument("--schema", choices=sorted(SCHEMAS), default="compact")
    args = p.parse_args(argv)
    out: dict = {}
    try:
        run(out, args.rows, args.changes, args.executor_memory, args.schema)
    finally:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, f"hosts_{args.schema}_{args.rows}.json"), "w") as f:
            json.dump(out, f, indent=2, default=str)
        print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
