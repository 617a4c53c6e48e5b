"""The backfill across hosts of their own, with a live writer and a fault mid-barrier.

Every server on a host of its own (tests/infra/hosts.py: a network namespace with its own
address on a bridge, a private /tmp and $HOME, the code read-only): the S3 server, the Spark
master, two workers, the writer and the drivers (each Dagster run on a driver host). Nothing is
shared but the network, so a path written on one host and read on another, an address that only
works on loopback or a temp file assumed visible everywhere fails here.

The scenario: an upstream on the store, a live writer on its host while the first barrier runs,
a fault in that barrier, then barriers until every vnode is finished. Checks: the barrier hit by
the fault either completed or failed, never half (verify_job right after it: every vnode equals
the oracle at its recorded version); every later barrier is exact; at the end the MV equals the
upstream's latest version recomputed with pyarrow alone (nothing lost or doubled, no key twice);
the store holds only the upstream and the MV; no host but the S3 server holds a table byte in
its private folders; and each host listens only on the ports docs/SCALE_OUT.md names.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from tests.infra.host_cluster import PORTS, HostCluster, start_host_cluster
from tests.infra.host_runs import VNODES, Deployment, finished, named_failure, table_bytes, wait_for
from tests.infra.hosts import Host, Network, available

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
ROWS = 6000
# a cut link is noticed by heartbeats: seconds, not Spark's default two minutes
FAST_LOSS = {"spark.network.timeout": "12s", "spark.network.timeoutInterval": "4s",
             "spark.executor.heartbeatInterval": "2s"}
COMMIT_CUT_SECONDS = 10  # longer than the store client's first retries, shorter than its budget


@pytest.fixture
def cluster(tmp_path):
    reason = available()
    if reason:
        pytest.skip(f"hosts need network namespaces: {reason}")
    net = Network(str(tmp_path / "hosts"))
    try:
        yield start_host_cluster(net, workers=2, drivers=2)
    finally:
        net.close()


def _tasks(cluster: HostCluster, hosts: list[Host], word: str) -> int:
    return sum(cluster.executor_log(h).count(f"{word} task") for h in hosts)


def _undocumented_ports(host: Host, role: str) -> dict[int, str]:
    """Ports ``host`` listens on beyond docs/SCALE_OUT.md's for its role, with their process."""
    return {p: who for p, who in host.listening().items() if p not in PORTS[role]}


def worker_killed(cluster: HostCluster, run) -> Host:
    """worker1's processes SIGKILLed while it runs tasks; a new host (worker3) replaces it."""
    lost = cluster.workers[0]
    wait_for("tasks on worker1", lambda: _tasks(cluster, [lost], "Running") >= 1, run)
    cluster.notes["driver1 ports"] = _undocumented_ports(cluster.drivers[0], "driver")
    lost.kill_all()
    wait_for("the executor's loss", lambda: "Lost executor" in run.log_tail(10**7), run)
    cluster.start_worker(cluster.net.add("worker3"))
    return cluster.drivers[0]


def worker_cut(cluster: HostCluster, run) -> Host:
    """worker1's link down while it runs tasks, back up once its executor was given up."""
    lost = cluster.workers[0]
    wait_for("tasks on worker1", lambda: _tasks(cluster, [lost], "Running") >= 1, run)
    cluster.net.cut(lost)
    time.sleep(20)
    cluster.net.mend(lost)
    return cluster.drivers[0]


def s3_cut(cluster: HostCluster, run) -> Host:
    """The S3 host unreachable for seconds as the first tasks' files are committed."""
    wait_for("finished tasks", lambda: _tasks(cluster, cluster.workers, "Finished") >= 1, run)
    cluster.net.cut(cluster.s3)
    time.sleep(8)
    cluster.net.mend(cluster.s3)
    return cluster.drivers[0]


COMMITTED_TABLE = {"mv_data_files_written": "downstream_mv",
                   "before_progress_commit": "backfill_progress"}


def s3_cut_in_commit(point: str) -> Callable[..., Host]:
    """The S3 host cut off while driver1's step is held at ``point`` (the run paused there,
    testing/kill_hook.py), then the step released: the commit that follows (its log entry's
    PUT) meets an unreachable store, which comes back COMMIT_CUT_SECONDS later. The store must
    see the commit's log entry only after it came back: the client retried it."""
    def fault(cluster: HostCluster, run) -> Host:
        driver, store = cluster.drivers[0], cluster.servers["s3"]
        marker = os.path.join(driver.tmp, f"backfill-paused-{point}")
        wait_for(f"the step paused at {point}", lambda: os.path.exists(marker), run)
        seen = len(store.log_tail(10**9))
        cluster.net.cut(cluster.s3)
        os.remove(marker)
        time.sleep(COMMIT_CUT_SECONDS)
        during = store.log_tail(10**9)[seen:]
        cluster.net.mend(cluster.s3)
        assert "_delta_log/" not in during, during[-2000:]
        entry = re.compile(rf'"PUT [^"]*/{COMMITTED_TABLE[point]}/_delta_log/\d+\.json')
        wait_for("the commit's log entry on the store",
                 lambda: entry.search(store.log_tail(10**9)[seen:]) is not None, run)
        return driver

    fault.__name__ = f"s3_cut_in_commit({point})"
    return fault


def driver_killed(cluster: HostCluster, run) -> Host:
    """driver1's every process SIGKILLed and its link cut mid-slice; driver2 takes over."""
    wait_for("tasks", lambda: _tasks(cluster, cluster.workers, "Running") >= 1, run)
    cluster.drivers[0].kill_all()
    cluster.net.cut(cluster.drivers[0])
    return cluster.drivers[1]


def _scenario(cluster: HostCluster, mode: str, fault: Callable[..., Host],
              run_env: dict[str, str] | None = None) -> None:
    dep = Deployment(cluster, mode)
    dep.load(seed=7, initial_rows=ROWS, versions=1, changes_per_version=40)
    writer = dep.start_writer(seed=8, versions=10, changes_per_version=30, rate=1.0)
    run = dep.start_run(cluster.drivers[0], spark_conf=FAST_LOSS, env=run_env)
    driver = fault(cluster, run)
    code = finished(run, 420)
    out = run.log_tail(10**7)
    # completed, or failed as a whole (a run the fault killed has no say) and by name
    assert code != 0 or "RUN_SUCCESS" in out, out[-4000:]
    assert code in (0, -9) or named_failure(out), f"unnamed failure:\n{out[-4000:]}"
    dep.verify(driver)  # never half: every vnode equals the oracle at its recorded version
    assert finished(writer, 300) == 0, writer.log_tail()
    dep.run(driver)  # the next barrier, over the live writer's versions
    dep.verify(driver)
    dep.load(seed=9, versions=2, changes_per_version=30)
    for _ in range(4):  # barriers until every vnode is finished at the latest version
        if f"{VNODES}/{VNODES} finished" in dep.run(driver):
            break
    else:
        raise AssertionError("vnodes still unfinished after four barriers")
    dep.verify(driver)
    diff = dep.compare()
    assert diff["missing"] == diff["unexpected"] == diff["duplicate_keys"] == 0, diff
    assert diff["mv_rows"] == diff["expected_rows"] > 0, diff
    assert dep.tables() == {"upstream", "orders_mv"}
    _no_table_bytes_off_the_store(cluster)


def _no_table_bytes_off_the_store(cluster: HostCluster) -> None:
    for name, host in cluster.net.hosts.items():
        if name != "s3":
            assert table_bytes(host) == [], f"table bytes on {name}: {table_bytes(host)[:5]}"
    roles = {"s3": "s3", "master": "master", **{h.name: "worker" for h in cluster.workers}}
    extra = {**cluster.notes, **{name: _undocumented_ports(cluster.net.hosts[name], role)
                                 for name, role in roles.items()}}
    assert not any(extra.values()), f"ports not in docs/SCALE_OUT.md: {extra}"


def test_snapshot_backfill_across_hosts_survives_a_lost_worker(cluster):
    """The core scenario (CI): snapshot mode, worker1's processes killed mid-barrier."""
    _scenario(cluster, "snapshot", worker_killed)


@pytest.mark.variant
@pytest.mark.parametrize("fault", [worker_cut, s3_cut, driver_killed],
                         ids=["worker-cut", "s3-cut", "driver-killed"])
@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_backfill_across_hosts_with_a_fault(cluster, mode, fault):
    _scenario(cluster, mode, fault)


@pytest.mark.variant
def test_arrangement_backfill_across_hosts_survives_a_lost_worker(cluster):
    _scenario(cluster, "arrangement", worker_killed)


@pytest.mark.variant
@pytest.mark.parametrize("point", ["mv_data_files_written", "before_progress_commit"])
@pytest.mark.parametrize("mode", ["snapshot", "arrangement"])
def test_store_cut_off_during_a_commit(cluster, mode, point):
    """The store unreachable as a commit's log entry is published (the MV's, the progress
    table's): the commit is retried or refused by name, never half; the next barrier exact."""
    _scenario(cluster, mode, s3_cut_in_commit(point), {"BACKFILL_TEST_KILL_AT": f"pause:{point}"})
