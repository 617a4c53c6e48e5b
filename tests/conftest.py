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
