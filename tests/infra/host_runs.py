"""Dagster runs, the live writer and the checks of the host tests (tests/scale/test_hosts.py).

Why here: the scenario steps (a run on a driver host, a writer on its own host, the oracle, the
scan of private folders for table bytes) are shared by every fault the tests inject.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable

from tests.infra import procs
from tests.infra.dagster_cli import mv_yaml
from tests.infra.host_cluster import HostCluster
from tests.infra.hosts import Host
from tests.infra.s3_server import BUCKET

VNODES = 8
TASKS = "tests.infra.host_tasks"
PARQUET_MAGIC = b"PAR1"
# the Spark and store errors docs/SCALE_OUT.md names ("When a faulted run fails") beside the
# platform's own (core/errors.py): a failed run must lead with one of them
DOCUMENTED_FAILURES = ("SparkException", "GenericError")


class Deployment:
    """One MV on the host cluster: its warehouse on the S3 host, runs on driver hosts."""

    def __init__(self, cluster: HostCluster, mode: str, name: str = "wh",
                 mv: dict | None = None) -> None:
        """``mv``: fields of jobs/configs/mv.yaml to replace (columns, filter, computed...)."""
        self.cluster, self.mode, self.mv = cluster, mode, dict(mv or {})
        self.warehouse = f"s3://{BUCKET}/{name}"
        self.upstream = f"{self.warehouse}/upstream"
        self.runs = 0

    def settings(self, driver: Host, spark_conf: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> dict[str, str]:
        """Everything a run on ``driver`` is configured by (files on the driver host only);
        ``env``: more variables (a pause point, BACKFILL_TEST_KILL_AT)."""
        os.makedirs(os.path.join(driver.tmp, "dagster_home"), exist_ok=True)
        mv_yaml(driver.tmp, **{"chunk_size": 400, "vnode_count": VNODES, "mode": self.mode,
                               **self.mv})
        return {**self.cluster.driver_env(driver, spark_conf),
                "BACKFILL_WAREHOUSE": self.warehouse, "BACKFILL_VNODE_COUNT": str(VNODES),
                "BACKFILL_MV_CONFIG": "/tmp/mv.yaml", **(env or {})}

    def load(self, timeout: float = 300, **params) -> dict:
        """The load generator on the writer host, to its end."""
        out = self.cluster.writer.python(TASKS, "load", self.upstream,
                                         json.dumps({**params, "vnode_count": VNODES}),
                                         env=self.cluster.store_env(), timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def start_writer(self, **params) -> procs.Server:
        """The live writer: the load generator in the background on the writer host."""
        argv = [sys.executable, "-m", TASKS, "load", self.upstream,
                json.dumps({**params, "vnode_count": VNODES})]
        return self.cluster.net.keep(self.cluster.writer.start(
            f"writer-{time.monotonic_ns()}", argv, self.cluster.store_env()))

    def start_run(self, driver: Host, job: str = "backfill_job",
                  spark_conf: dict[str, str] | None = None,
                  env: dict[str, str] | None = None) -> procs.Server:
        """``dagster job execute`` of ``job`` on ``driver``, in the background."""
        self.runs += 1
        argv = [sys.executable, "-m", "dagster", "job", "execute", "-m",
                "backfill_assets.definitions", "-j", job]
        return self.cluster.net.keep(driver.start(f"run{self.runs}-{job}", argv,
                                                  self.settings(driver, spark_conf, env)))

    def run(self, driver: Host, job: str = "backfill_job", timeout: float = 420) -> str:
        """A run on ``driver`` to its end; its output (it must succeed)."""
        server = self.start_run(driver, job)
        finished(server, timeout)
        out = server.log_tail(10**7)
        assert server.proc.returncode == 0 and "RUN_SUCCESS" in out, out[-5000:]
        return out

    def verify(self, driver: Host) -> None:
        """verify_job (the platform's oracle: each vnode recomputed at its recorded version)."""
        out = self.run(driver, "verify_job")
        assert f"over {VNODES} vnodes: 0 vnodes differ" in out, out[-3000:]

    def compare(self) -> dict:
        """The MV against the upstream's latest version, recomputed with pyarrow alone on the
        writer host (tests/infra/host_tasks.py)."""
        out = self.cluster.writer.python(TASKS, "compare", self.upstream,
                                         f"{self.warehouse}/orders_mv/downstream_mv",
                                         env=self.cluster.store_env())
        return json.loads(out.strip().splitlines()[-1])

    def tables(self) -> set[str]:
        """The top-level names under the warehouse on the store."""
        out = self.cluster.writer.python(TASKS, "objects", self.warehouse,
                                         env=self.cluster.store_env())
        return {k.split("/", 1)[0] for k in json.loads(out.strip().splitlines()[-1])["keys"]}


def finished(server: procs.Server, timeout: float) -> int:
    """Wait for a run's process to end; its exit code."""
    deadline = time.monotonic() + timeout
    while server.proc.poll() is None:
        assert time.monotonic() < deadline, f"{server.name} still running:\n{server.log_tail()}"
        time.sleep(0.5)
    return server.proc.returncode


def wait_for(what: str, ready: Callable[[], bool], alive: procs.Server,
             timeout: float = 300) -> None:
    """Poll ``ready`` while ``alive`` runs: the fault must land while the run is in flight."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert alive.proc.poll() is None, f"{alive.name} ended before {what}:\n" \
                                          f"{alive.log_tail()}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f}s"
        time.sleep(0.3)


def table_bytes(host: Host) -> list[str]:
    """Files in ``host``'s private folders that hold table data: parquet (by name or by its
    magic bytes), Delta log entries, deletion vectors. Executors' jars and logs are not."""
    found = []
    for folder, _, files in os.walk(host.private):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith((".parquet", ".bin")) or "_delta_log" in path:
                found.append(path)
                continue
            try:
                with open(path, "rb") as f:
                    if f.read(4) == PARQUET_MAGIC:
                        found.append(path)
            except OSError:
                continue
    return found


def named_failure(out: str) -> str | None:
    """The named error a failed run's output gives as ``Name: message``: a BackfillError
    subclass (core/errors.py) or one of DOCUMENTED_FAILURES; None when it names none."""
    from backfill_assets.core import errors

    names = {c.__name__ for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.BackfillError)}
    found = re.search(rf"\b({'|'.join(sorted(names | set(DOCUMENTED_FAILURES)))}): ", out)
    return found.group(1) if found else None
