"""The Spark resource: dagster-pyspark's LazyPySparkResource, set up for this platform.

Lazy: building the resource, loading the definitions or evaluating a sensor never starts a JVM;
the session starts the first time an op touches ``.spark_session``. Defaults to ``local[*]`` on
loopback; the master URL and any Spark conf come from settings (BACKFILL_SPARK_MASTER,
BACKFILL_SPARK_CONF). One session per process: the resource and ``get_spark`` both use
``SparkSession.builder.getOrCreate()``, so a test fixture and an op share it.

Beyond one machine, settings only: ``BACKFILL_SPARK_MASTER=spark://host:7077`` runs executors
in their own JVMs and Python workers (the driver advertises BACKFILL_SPARK_DRIVER_HOST, default
127.0.0.1); ``BACKFILL_SPARK_REMOTE=sc://host:15002`` makes the session a Spark Connect client
(no local JVM at all; the platform's ``spark.sql.*`` conf is set on the session, anything
else belongs in the Connect server's own conf).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from dagster_pyspark import LazyPySparkResource

from resources import delta_jars
from resources.class_archive import java_options
from resources.settings import Settings, load_settings

BASE_SPARK_CONF: dict[str, str] = {
    "spark.app.name": "backfill-assets",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # per-vnode snapshot chunks are `row_number() <= chunk` per vnode: let Spark apply its
    # group limit (a top-k per vnode before the shuffle) for chunk sizes above its default 1000
    "spark.sql.optimizer.windowGroupLimitThreshold": "100000000",
    # files Spark writes into Delta tables: Delta/delta-rs expect microsecond timestamps
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.default.parallelism": "4",
    # rows per Arrow batch between the JVM and the storage layer's Python tasks (default
    # 10,000): fewer, larger batches cost less per row on both sides
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    # the storage layer's reads are Python tasks over a tiny local relation of file lists, so
    # Spark estimates them at a few KB and would broadcast a whole table read into a join (a
    # 100M-row catch-up merge ran the driver out of heap): broadcast only where the code says
    # so (`F.broadcast` of a small positions or keys table)
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.python.filterPushdown.enabled": "true",
    # pandas is not a dependency: plain (pickled) Python UDFs, no arrow-UDF fallback warning
    "spark.sql.execution.pythonUDF.arrow.enabled": "false",
    "spark.log.level": "WARN",
}


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
REMOTE_KEY = "spark.remote"  # pyspark's own builder key for a Connect URL
# pyspark sets these in os.environ for a Connect session; a classic session (or a child
# process that inherits them) must not see them, or it tries to be a Connect client
CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def spark_conf(settings: Settings) -> dict[str, str]:
    """The full Spark conf: platform defaults, then the master and driver address (or the
    Connect URL), Delta's jars, SQL extension and catalog (resources/delta_jars.py: classic
    sessions, local or cluster), then BACKFILL_SPARK_CONF, then the driver JVM's class archive
    when there is one (resources/class_archive.py: a session starts sooner)."""
    conf = dict(BASE_SPARK_CONF)
    if settings.spark_remote:
        conf[REMOTE_KEY] = settings.spark_remote
    else:
        conf["spark.master"] = settings.spark_master
        host = settings.spark_driver_host
        conf["spark.driver.host"] = host
        # a loopback driver binds loopback only; a routable one must accept remote executors
        conf["spark.driver.bindAddress"] = host if host in LOOPBACK_HOSTS else "0.0.0.0"
    if not settings.spark_remote:  # a Connect server loads Delta at its own start
        conf.update(delta_jars.session_conf())
    conf.update(settings.spark_conf)
    if not settings.spark_remote:  # a Connect client starts no JVM
        mapped = java_options(settings.spark_class_archive)
        if mapped:
            own = conf.get(DRIVER_JAVA_OPTIONS, "")
            conf[DRIVER_JAVA_OPTIONS] = f"{own} {mapped}".strip()
    return conf


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` for a child process that may start its own (classic) session: without
    the Connect variables pyspark put there for this process's Connect session."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV_VARS}
    env.update(extra or {})
    return env


def prepare_python_env() -> None:
    """Executors must run this interpreter (not whatever python3 is first on PATH)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def prepare_local_env(conf: dict[str, Any]) -> None:
    """A loopback driver binds to loopback (no "hostname resolves to a loopback address"),
    and a classic session never runs in Connect mode inherited from a parent process."""
    for var in CONNECT_ENV_VARS:
        os.environ.pop(var, None)
    host = str(conf.get("spark.driver.host", "127.0.0.1"))
    if host in LOOPBACK_HOSTS:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session_from_conf(conf: dict[str, Any]) -> Any:
    """getOrCreate a session with ``conf`` (the one session of this process): a Spark Connect
    client when ``conf`` has ``spark.remote``, a classic session otherwise."""
    prepare_python_env()
    from pyspark.sql import SparkSession  # imported here: loading definitions stays light

    from backfill_assets.storage import settle_driver_memory

    settle_driver_memory()  # the driver hands freed native memory back (storage/store/memory.py)

    if conf.get(REMOTE_KEY):
        return connect_session(str(conf[REMOTE_KEY]), conf)
    prepare_local_env(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    return builder.getOrCreate()


def connect_session(url: str, conf: dict[str, Any]) -> Any:
    """A Spark Connect session at ``url`` with the platform's session (``spark.sql.*``) conf.
    Static and non-SQL keys cannot change on a running server: they are skipped with a
    warning naming them (set them in the server's conf instead)."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(url).getOrCreate()
    refused = []
    for key, value in conf.items():
        if not key.startswith("spark.sql."):
            continue
        try:
            session.conf.set(key, str(value))
        except Exception:  # the server refuses static confs (CANNOT_MODIFY_CONFIG)
            refused.append(key)
    if refused:
        warnings.warn(
            f"the Spark Connect server at {url} refused session conf {sorted(refused)}: set "
            "them in the server's own conf (spark-submit --conf) if the platform needs them",
            stacklevel=2,
        )
    return session


class LazySession:
    """A Spark session started on first use, for code that takes a session but may not need
    one: a barrier small enough for the driver engine, under a definition its progress table
    has pinned, never touches Spark, and then runs without starting a JVM (a JVM start is
    most of a small catch-up's time in a `dagster job execute`)."""

    def __init__(self, start: Callable[[], Any], conf: Mapping[str, str] | None = None):
        self._start = start
        self._session: Any = None
        self._conf = dict(conf or {})

    @property
    def started(self) -> bool:
        return self._session is not None

    @property
    def planned_master(self) -> str | None:
        """Where the session's tasks will run, from the conf it starts with, before it has
        started: its master, ``"remote"`` for a Connect session, None when not known. The
        storage layer asks this to run a chunk's tasks in this process on a local master
        (``storage.rows.scan.tasks_run_here``) without starting a JVM to learn it."""
        if REMOTE_KEY in self._conf:
            return "remote"
        return self._conf.get("spark.master")

    def __getattr__(self, name: str) -> Any:
        if self._session is None:
            self._session = self._start()
        return getattr(self._session, name)


class PlatformSparkResource(LazyPySparkResource):
    """LazyPySparkResource that points executors at the running interpreter first."""

    def _init_session(self) -> None:
        if self._spark_session is None:
            self._spark_session = session_from_conf(self.spark_config)


def spark_resource(settings: Settings | None = None) -> LazyPySparkResource:
    """The platform's Spark resource (lazy) for ``settings`` (default: the environment)."""
    return PlatformSparkResource(spark_config=spark_conf(settings or load_settings()))


def get_spark(settings: Settings | None = None) -> Any:
    """The process's Spark session for scripts and tests (same conf as the resource)."""
    return session_from_conf(spark_conf(settings or load_settings()))
