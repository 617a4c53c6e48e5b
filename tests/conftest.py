"""Shared fixtures: ONE Spark session for the whole test process, temporary warehouses.

Tests use real Spark (local, loopback), real Delta tables in temporary folders and real Dagster.
The Spark session is session-scoped and built by ``resources.spark.get_spark`` - the same
``getOrCreate`` the Dagster resource uses - so an op run in-process shares it.

Under pytest-xdist (`make test`: 2 workers) every "session" here is a worker's: its own Spark
session and its own servers, on ports of its own (tests/infra/procs.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# Before anything can start a JVM: executors must run this interpreter.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# No per-example deadline (Hypothesis' default is 200 ms) and no "too slow" data generation
# check: most property tests already say so, and the others would fail by timing alone on a
# loaded machine (2 workers, Spark JVMs). Tests with their own suppress_health_check list
# name too_slow there themselves.
hypothesis_settings.register_profile("suite", deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("suite")


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """Under pytest-xdist the tests marked slow go first (each worker collects the same order;
    the scheduler hands tests out in it, two at a time with `--maxschedchunk 1`, see the
    Makefile): the long ones then run side by side early instead of one of them starting last
    and leaving the other worker idle. Serial runs keep file order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


@pytest.fixture(scope="session")
def spark():
    """The process's Spark session (local, 2 shuffle partitions would do; conf from settings)."""
    from resources.settings import load_settings
    from resources.spark import get_spark

    session = get_spark(load_settings())
    yield session
    # Never stopped here: Dagster resources in this process share it; the JVM exits with us.


@pytest.fixture
def warehouse(tmp_path) -> str:
    """A fresh local warehouse folder (absolute path)."""
    path = tmp_path / "warehouse"
    path.mkdir()
    return str(path)


@pytest.fixture
def dagster_home(tmp_path) -> str:
    """A fresh DAGSTER_HOME folder (for `dagster job execute` subprocesses)."""
    path = tmp_path / "dagster_home"
    path.mkdir()
    return str(path)


# --- servers for the scale-out tests (tests/infra): session-scoped, loopback, die with pytest


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A moto S3 server with one bucket: ``.storage_options`` (deltalake-style AWS_* keys),
    ``.bucket_uri``, ``.fresh_uri(name)`` and ``.env()`` for subprocesses."""
    from tests.infra.s3_server import start_s3_server

    server = start_s3_server(str(tmp_path_factory.mktemp("s3")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone master + one worker on loopback; ``.master_url`` is
    ``spark://127.0.0.1:<port>`` for BACKFILL_SPARK_MASTER. Drivers must be other processes
    (this process's own session is local)."""
    from tests.infra.spark_servers import start_cluster

    cluster = start_cluster(str(tmp_path_factory.mktemp("spark-cluster")))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory):
    """A Spark Connect server on loopback (its own local[2] Spark); ``.remote_url`` is
    ``sc://127.0.0.1:<port>`` for BACKFILL_SPARK_REMOTE."""
    from tests.infra.spark_servers import start_connect_server

    server = start_connect_server(str(tmp_path_factory.mktemp("spark-connect")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on loopback with a ``dagster`` database; ``.env()`` gives the
    DAGSTER_PG_* variables deploy/dagster.postgres.yaml reads."""
    from tests.infra.postgres_server import start_postgres

    server = start_postgres()
    yield server
    server.stop()


# --- figures of the reliability suite: every test adds what it ran, the session prints the sum.
# Set RELIABILITY_FIGURES=/path/file.json to also get them as JSON (docs/RELIABILITY.md quotes
# the figures of the last run). Here, not in a conftest of tests/reliability/: under pytest-xdist
# the controller never loads that one (it collects nothing), so the workers hand their sums in
# (workeroutput) and the controller adds them up and reports.

FIGURES: Counter = Counter()
_FIGURES_KEY = "reliability_figures"


@pytest.fixture
def figures() -> Counter:
    """Add to it: scenarios, kills, rows_compared, mismatches, ..."""
    return FIGURES


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[_FIGURES_KEY] = dict(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # noqa: ARG001 - pytest-xdist's hook, on the controller
    FIGURES.update(getattr(node, "workeroutput", {}).get(_FIGURES_KEY, {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if not FIGURES or hasattr(config, "workerinput"):
        return
    terminalreporter.write_line("reliability figures: " + json.dumps(dict(sorted(FIGURES.items()))))
    path = os.environ.get("RELIABILITY_FIGURES")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(FIGURES.items())), f, indent=2)
