"""A Spark standalone master + worker and a Spark Connect server, from the pyspark wheel.

Why: the platform must run on a real cluster (executors in their own JVMs and Python workers,
nothing shared with the driver but the network) and as a Spark Connect client. The pyspark
wheel ships everything needed: ``bin/spark-class`` starts
``org.apache.spark.deploy.master.Master`` / ``org.apache.spark.deploy.worker.Worker``, and
``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (the class
``sbin/start-connect-server.sh`` runs; the spark-connect jar is in the wheel's ``jars/``).
All bind 127.0.0.1, use small memory, and die with the test process (tests/infra/procs.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from jobs.ports import free_port
from resources import delta_jars
from tests.infra import procs

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER_CORES = 2
WORKER_MEMORY = "2g"
DAEMON_MEMORY = "256m"


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the Spark daemons: loopback, small daemons, this interpreter for
    Python workers, no Connect mode leaking in (it would make them Connect clients)."""
    env = procs.clean_env({
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": procs.LOOPBACK,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_CONNECT_MODE": "0",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
        # a taken --port / --webui-port is an error, not a silent move to port+1 (the tests
        # wait for and connect to the port they chose; +1 may be another worker's server)
        # the master's REST submission server has a fixed port (6066): off, so two test
        # processes' masters never meet there (nothing here submits through it)
        "SPARK_MASTER_OPTS": "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false",
        "SPARK_WORKER_OPTS": "-Dspark.port.maxRetries=0",
        # executors' Python workers unpickle functions of the project's modules
        "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p),
    })
    env.update(extra or {})
    return env


@dataclass
class StandaloneCluster:
    """A running master and one worker: ``master_url`` is what BACKFILL_SPARK_MASTER takes."""

    master_url: str
    master: procs.Server
    worker: procs.Server

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()


def start_cluster(work_dir: str, cores: int = WORKER_CORES,
                  memory: str = WORKER_MEMORY) -> StandaloneCluster:
    """Start a master and a worker on loopback; return once the worker has registered."""
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    port, ui = free_port(), free_port()
    master = procs.start("spark-master", [
        spark_class, "org.apache.spark.deploy.master.Master",
        "--host", procs.LOOPBACK, "--port", str(port), "--webui-port", str(ui),
    ], os.path.join(work_dir, "master.log"), env=_env())
    master.wait_until(lambda: procs.port_open(port), timeout=90)
    url = f"spark://{procs.LOOPBACK}:{port}"
    worker_dir = os.path.join(work_dir, "worker")
    os.makedirs(worker_dir, exist_ok=True)
    worker = procs.start("spark-worker", [
        spark_class, "org.apache.spark.deploy.worker.Worker", url,
        "--host", procs.LOOPBACK, "--cores", str(cores), "--memory", memory,
        "--webui-port", str(free_port()), "--work-dir", worker_dir,
    ], os.path.join(work_dir, "worker.log"), env=_env())
    try:
        master.wait_until(lambda: "Registering worker" in master.log_tail(20000), timeout=90)
    except BaseException:
        worker.stop()
        master.stop()
        raise
    return StandaloneCluster(url, master, worker)


@dataclass
class ConnectServer:
    """A running Spark Connect server: ``remote_url`` is what BACKFILL_SPARK_REMOTE takes."""

    remote_url: str
    server: procs.Server

    def stop(self) -> None:
        self.server.stop()


def start_connect_server(work_dir: str, master: str = "local[2]",
                         conf: dict[str, str] | None = None) -> ConnectServer:
    """Start a Connect server on loopback whose own Spark runs on ``master``. Server-side
    (static) conf goes in ``conf``; the platform's session confs are set by the client."""
    port = free_port()
    settings = {
        "spark.connect.grpc.binding.address": procs.LOOPBACK,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": procs.LOOPBACK,
        "spark.driver.bindAddress": procs.LOOPBACK,
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "WARN",
        # Delta on the server (its jars, SQL extension and catalog are static conf): a client
        # then reads and writes format("delta") and runs Delta SQL (resources/delta_jars.py)
        **delta_jars.session_conf(),
        **(conf or {}),
    }
    argv = [os.path.join(spark_home(), "bin", "spark-submit"),
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "backfill-connect-server", "--master", master]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    # the launcher sizes a Connect server's heap like a daemon's (SPARK_DAEMON_MEMORY)
    server = procs.start("spark-connect", argv, os.path.join(work_dir, "connect.log"),
                         env=_env({"SPARK_DAEMON_MEMORY": settings["spark.driver.memory"]}))
    server.wait_until(lambda: procs.port_open(port), timeout=120)
    return ConnectServer(f"sc://{procs.LOOPBACK}:{port}", server)
