"""Shared fixtures: ONE Spark session for the whole test process, temporary warehouses.

Tests use real Spark (local, loopback), real Delta tables in temporary folders and real Dagster.
The Spark session is session-scoped and built by ``resources.spark.get_spark`` - the same
``getOrCreate`` the Dagster resource uses - so an op run in-process shares it.
"""

from __future__ import annotations

import os
import sys

import pytest

# Before anything can start a JVM: executors must run this interpreter.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


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
