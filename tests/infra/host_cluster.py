"""The platform across hosts (tests/infra/hosts.py): S3 server, Spark master, workers, drivers.

Why fixed ports: every host has a port space of its own, so each server listens where
docs/SCALE_OUT.md says a deployment's does ("Ports"), and the tests check that no host listens
anywhere else. Readiness is read from the servers' logs (the test process is on no host, so it
cannot connect to them; nothing here reaches outside the namespaces).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from tests.infra import procs
from tests.infra.hosts import Host, Network
from tests.infra.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY
from tests.infra.spark_servers import DAEMON_MEMORY, spark_home

S3_PORT = 9000
MASTER_PORT, MASTER_UI_PORT = 7077, 8080
WORKER_PORT, WORKER_UI_PORT = 7078, 8081
DRIVER_PORT, BLOCK_MANAGER_PORT = 7079, 7080
# every port a host of each role listens on beyond loopback (docs/SCALE_OUT.md, "Ports")
PORTS = {"s3": {S3_PORT}, "master": {MASTER_PORT, MASTER_UI_PORT},
         "worker": {WORKER_PORT, WORKER_UI_PORT, BLOCK_MANAGER_PORT},
         "driver": {DRIVER_PORT, BLOCK_MANAGER_PORT}}
WORKER_CORES = 1
WORKER_MEMORY = "1g"


def _spark_env(host: Host) -> dict[str, str]:
    """The Spark daemons' environment on ``host`` (as tests/infra/spark_servers.py, with the
    host's address and fixed ports)."""
    return {
        "SPARK_HOME": spark_home(), "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_CONNECT_MODE": "0", "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_MASTER_OPTS": "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false",
        "SPARK_WORKER_OPTS": "-Dspark.port.maxRetries=0",
        "SPARK_LOCAL_IP": host.address,
    }


@dataclass
class HostCluster:
    """The servers on their hosts; ``drivers`` and ``writer`` run clients only."""

    net: Network
    s3: Host
    master: Host
    workers: list[Host]
    drivers: list[Host]
    writer: Host
    servers: dict[str, procs.Server] = field(default_factory=dict)
    notes: dict[str, dict] = field(default_factory=dict)  # what a test saw mid-run

    @property
    def endpoint(self) -> str:
        return f"http://{self.s3.address}:{S3_PORT}"

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.address}:{MASTER_PORT}"

    @property
    def storage_options(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_ALLOW_HTTP": "true"}

    def store_env(self) -> dict[str, str]:
        """The store's settings as a deployment sets them: values in AWS_* variables and
        BACKFILL_STORAGE_OPTIONS naming them."""
        opts = self.storage_options
        return {**opts, "BACKFILL_STORAGE_OPTIONS": json.dumps({k: k for k in opts})}

    def driver_env(self, driver: Host, spark_conf: dict[str, str] | None = None
                   ) -> dict[str, str]:
        """A Dagster run's settings on ``driver``: the master, this host's address, the
        driver's fixed ports, small memory."""
        conf = {"spark.driver.port": str(DRIVER_PORT),
                "spark.blockManager.port": str(BLOCK_MANAGER_PORT),
                "spark.port.maxRetries": "0", "spark.driver.memory": "768m",
                "spark.executor.memory": "768m", "spark.executor.cores": str(WORKER_CORES),
                **(spark_conf or {})}
        return {**self.store_env(), "BACKFILL_SPARK_MASTER": self.master_url,
                "BACKFILL_SPARK_DRIVER_HOST": driver.address,
                "BACKFILL_SPARK_CONF": json.dumps(conf),
                "DAGSTER_HOME": "/tmp/dagster_home"}

    def start_worker(self, host: Host) -> procs.Server:
        """Start a worker on ``host`` and wait until the master registered it."""
        before = self.servers["master"].log_tail(10**7).count(f"Registering worker {host.address}")
        work = os.path.join(host.tmp, "work")
        os.makedirs(work, exist_ok=True)
        worker = self.net.keep(host.start("worker", [
            os.path.join(spark_home(), "bin", "spark-class"),
            "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--host", host.address, "--port", str(WORKER_PORT),
            "--webui-port", str(WORKER_UI_PORT), "--cores", str(WORKER_CORES),
            "--memory", WORKER_MEMORY, "--work-dir", "/tmp/work",
        ], _spark_env(host)))
        self.servers[host.name] = worker
        master = self.servers["master"]
        worker.wait_until(lambda: master.log_tail(10**7).count(
            f"Registering worker {host.address}") > before, timeout=120)
        return worker

    def executor_log(self, host: Host) -> str:
        """Every executor's stderr on ``host`` (its private work folder), joined."""
        out = []
        for folder, _, files in os.walk(os.path.join(host.tmp, "work")):
            if "stderr" in files:
                with open(os.path.join(folder, "stderr"), errors="replace") as f:
                    out.append(f.read())
        return "\n".join(out)


def _start_s3(host: Host, net: Network) -> procs.Server:
    """moto on ``host`` (tests/infra/moto_atomic.py) and the test bucket in it."""
    server = net.keep(host.start("moto", [sys.executable, "-m", "tests.infra.moto_atomic",
                                          "-H", host.address, "-p", str(S3_PORT)]))
    server.wait_until(lambda: "Running on" in server.log_tail(), timeout=60)
    return server


def _start_master(host: Host, net: Network) -> procs.Server:
    master = net.keep(host.start("master", [
        os.path.join(spark_home(), "bin", "spark-class"),
        "org.apache.spark.deploy.master.Master", "--host", host.address,
        "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT),
    ], _spark_env(host)))
    master.wait_until(lambda: "I have been elected leader" in master.log_tail(), timeout=120)
    return master


def start_host_cluster(net: Network, workers: int = 2, drivers: int = 1) -> HostCluster:
    """Hosts s3, master, worker1.., driver1.. and writer; the servers started and ready, the
    bucket made (from the writer host, through the bridge)."""
    cluster = HostCluster(net, net.add("s3"), net.add("master"),
                          [net.add(f"worker{i + 1}") for i in range(workers)],
                          [net.add(f"driver{i + 1}") for i in range(drivers)], net.add("writer"))
    cluster.servers["s3"] = _start_s3(cluster.s3, net)
    cluster.writer.python("tests.infra.host_tasks", "bucket", BUCKET,
                          env=cluster.store_env())
    cluster.servers["master"] = _start_master(cluster.master, net)
    for host in cluster.workers:
        cluster.start_worker(host)
    return cluster
