"""Settings: the one place that reads the environment.

Every knob of the platform that is not per-run config comes from here, so scaling out (a Spark
master URL, an object-store warehouse, another vnode count) changes environment variables only.

=========================  ======================================  =============================
variable                   meaning                                 default
=========================  ======================================  =============================
BACKFILL_WAREHOUSE         root folder or URI of all tables         ``./warehouse`` (made absolute)
BACKFILL_VNODE_COUNT       vnodes per table (1..32768)              256
BACKFILL_CHUNK_SIZE        default snapshot chunk size in rows      10000
BACKFILL_SPARK_MASTER      Spark master URL (local[N], spark://,    ``local[*]``
                           yarn, k8s://)
BACKFILL_SPARK_REMOTE      Spark Connect URL ``sc://host:port``:    unset (classic Spark)
                           the resource becomes a Connect client
                           (BACKFILL_SPARK_MASTER is then unused)
BACKFILL_SPARK_DRIVER_HOST address executors use to reach the        ``127.0.0.1``
                           driver (spark.driver.host); a routable
                           one binds the driver to all interfaces
BACKFILL_SPARK_CONF        extra Spark conf, a JSON object          ``{}``
BACKFILL_SPARK_CLASS_ARCHIVE                                       ``share/backfill-assets/``
                           the driver JVM's class archive, used     ``spark-<ver>-classes.jsa``
                           when the file exists (resources/         under the venv
                           class_archive.py); ``off``: none
BACKFILL_STORAGE_OPTIONS   object-store options, a JSON object of   ``{}``
                           option -> *name of an environment
                           variable* holding the value (wired
                           through ``dagster.EnvVar``, so secrets
                           never appear in config or run records)
BACKFILL_MV_CONFIG         YAML file of the MV definition           ``jobs/configs/mv.yaml``
BACKFILL_MV_DIR            folder of MV definitions (``*.yaml``,    unset (the one file above)
                           ``*.yml``): the catalog of many MVs
                           (resources/catalog.py); not beside
                           BACKFILL_MV_CONFIG
BACKFILL_RUN_RANGES        vnode ranges the barrier sensor starts   1
                           one run for each (1..vnode count)
BACKFILL_CONTINUOUS        1: the barrier sensor keeps one          0
                           ``follower_job`` alive per vnode range
                           (continuous mode) instead of starting
                           one ``backfill_job`` run per barrier
BACKFILL_KEY_CACHE_MIB     memory a process may keep data files'   512
                           key columns in (small barriers' key
                           lookups, storage/rows/key_cache.py)
BACKFILL_TRACEBACK         1: a command that fails with a named     0
                           error prints the traceback after it
                           (backfill_assets/wiring/named_errors.py)
BACKFILL_TEST_KILL_AT      test only: ``point[@n]`` makes a step    unset
                           SIGKILL itself at that commit boundary,
                           ``pause:point[@n]`` wait there
                           (backfill_assets/testing/kill_hook.py)
DAGSTER_HOME               Dagster instance folder (passthrough)    unset
=========================  ======================================  =============================
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from backfill_assets.core.errors import InvalidSettings
from backfill_assets.core.vnode import DEFAULT_VNODE_COUNT, MAX_VNODE_COUNT
from backfill_assets.storage import table_uri
from resources.class_archive import ENV_CLASS_ARCHIVE, chosen_path

DEFAULT_CHUNK_SIZE = 10_000
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_WAREHOUSE = "warehouse"

ENV_WAREHOUSE = "BACKFILL_WAREHOUSE"
ENV_VNODE_COUNT = "BACKFILL_VNODE_COUNT"
ENV_CHUNK_SIZE = "BACKFILL_CHUNK_SIZE"
ENV_SPARK_MASTER = "BACKFILL_SPARK_MASTER"
ENV_SPARK_CONF = "BACKFILL_SPARK_CONF"
ENV_SPARK_REMOTE = "BACKFILL_SPARK_REMOTE"
ENV_SPARK_DRIVER_HOST = "BACKFILL_SPARK_DRIVER_HOST"
ENV_SPARK_CLASS_ARCHIVE = ENV_CLASS_ARCHIVE
DEFAULT_DRIVER_HOST = "127.0.0.1"
ENV_STORAGE_OPTIONS = "BACKFILL_STORAGE_OPTIONS"
ENV_MV_CONFIG = "BACKFILL_MV_CONFIG"
ENV_MV_DIR = "BACKFILL_MV_DIR"
# the MV served when neither of the two is set: the demo's, over the platform's own upstream
DEFAULT_MV_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "jobs", "configs", "mv.yaml")
ENV_RUN_RANGES = "BACKFILL_RUN_RANGES"
ENV_TEST_KILL_AT = "BACKFILL_TEST_KILL_AT"
ENV_CONTINUOUS = "BACKFILL_CONTINUOUS"
ENV_KEY_CACHE_MIB = "BACKFILL_KEY_CACHE_MIB"
ENV_TRACEBACK = "BACKFILL_TRACEBACK"
DEFAULT_KEY_CACHE_MIB = 512
_MASTER_RE = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|yarn|(spark|k8s|mesos)://\S+)$")
_REMOTE_RE = re.compile(r"^sc://[^\s/:]+(:\d+)?(/;\S*)?$")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?$|^\[[0-9A-Fa-f:]+\]$")


@dataclass(frozen=True)
class Settings:
    warehouse_root: str
    vnode_count: int = DEFAULT_VNODE_COUNT
    chunk_size: int = DEFAULT_CHUNK_SIZE
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    spark_remote: str | None = None  # sc://host:port: a Spark Connect client
    spark_driver_host: str = DEFAULT_DRIVER_HOST
    spark_class_archive: str | None = None  # the driver JVM's class archive (None: none)
    # storage option name -> name of the environment variable that holds its value
    storage_options_env: Mapping[str, str] = field(default_factory=dict)
    mv_config: str | None = None  # path of the MV definition YAML (None: the default)
    mv_dir: str | None = None  # folder of MV definitions (None: the one file above)
    run_ranges: int = 1  # vnode ranges the barrier sensor requests one run each for
    continuous: bool = False  # the sensor keeps followers alive instead of per-barrier runs
    traceback: bool = False  # a named error's traceback printed after it (named_errors.py)
    key_cache_mib: int = DEFAULT_KEY_CACHE_MIB  # bound of the process's key cache
    test_kill_at: str | None = None  # fault injection for the crash tests (never in production)
    dagster_home: str | None = None

    def storage_options(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The object-store options with their values read from the environment now: what the
        resources' EnvVars resolve to inside a run, for code outside one (the barrier sensor,
        scripts). Options whose variable is unset are left out."""
        env = os.environ if environ is None else environ
        return {k: env[v] for k, v in self.storage_options_env.items() if v in env}

    def table_uri(self, name: str) -> str:
        """URI of a table called ``name`` under the warehouse root."""
        return table_uri(self.warehouse_root, name)


def _positive_int(environ: Mapping[str, str], var: str, default: int, maximum: int) -> int:
    raw = environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= maximum:
        raise InvalidSettings(
            f"{var}={raw!r} is not allowed: use a whole number from 1 to {maximum} "
            f"(or unset it for the default {default})"
        )
    return value


def _json_object(environ: Mapping[str, str], var: str) -> dict[str, str]:
    raw = environ.get(var, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidSettings(
            f"{var} is not valid JSON ({exc.msg} at position {exc.pos}): it must be a JSON "
            'object of string keys to scalar values, e.g. {"spark.driver.memory": "4g"}'
        ) from None
    if not isinstance(value, dict) or not all(
        isinstance(v, (str, int, float, bool)) for v in value.values()
    ):
        raise InvalidSettings(
            f"{var} must be a JSON object of string keys to scalar values, got {raw!r}"
        )
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}


def _warehouse_root(environ: Mapping[str, str]) -> str:
    raw = environ.get(ENV_WAREHOUSE, "").strip()
    if not raw:
        return os.path.abspath(DEFAULT_WAREHOUSE)
    if "://" in raw:
        scheme = raw.split("://", 1)[0]
        if scheme == "file":
            return os.path.abspath(raw[len("file://") :])
        if not scheme.replace("+", "").replace("-", "").isalnum():
            raise InvalidSettings(
                f"{ENV_WAREHOUSE}={raw!r} is not allowed: use a local folder or a URI such as "
                "s3://bucket/prefix"
            )
        return raw.rstrip("/")
    return os.path.abspath(os.path.expanduser(raw))


def _flag(environ: Mapping[str, str], var: str) -> bool:
    raw = environ.get(var, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise InvalidSettings(f"{var}={raw!r} is not allowed: use 1 (on) or 0 (off)")


def _optional_path(environ: Mapping[str, str], var: str) -> str | None:
    raw = environ.get(var, "").strip()
    return os.path.abspath(os.path.expanduser(raw)) if raw else None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: ``os.environ``); raise InvalidSettings
    naming the variable and what it allows on a bad value."""
    env = os.environ if environ is None else environ
    master = env.get(ENV_SPARK_MASTER, "").strip() or DEFAULT_SPARK_MASTER
    if not _MASTER_RE.match(master):
        raise InvalidSettings(
            f"{ENV_SPARK_MASTER}={master!r} is not allowed: use local[*], local[N], "
            "spark://host:port, yarn or k8s://... (a Spark Connect sc:// URL goes in "
            f"{ENV_SPARK_REMOTE})"
        )
    remote = env.get(ENV_SPARK_REMOTE, "").strip() or None
    if remote is not None and not _REMOTE_RE.match(remote):
        raise InvalidSettings(
            f"{ENV_SPARK_REMOTE}={remote!r} is not allowed: use a Spark Connect URL such as "
            "sc://127.0.0.1:15002 (optionally sc://host:port/;token=...), or unset it for "
            "classic Spark"
        )
    driver_host = env.get(ENV_SPARK_DRIVER_HOST, "").strip() or DEFAULT_DRIVER_HOST
    if not _HOST_RE.match(driver_host):
        raise InvalidSettings(
            f"{ENV_SPARK_DRIVER_HOST}={driver_host!r} is not allowed: use a host name or IP "
            "address the executors can reach (default 127.0.0.1)"
        )
    storage_env = _json_object(env, ENV_STORAGE_OPTIONS)
    for option, var in storage_env.items():
        if not var or not var.replace("_", "").isalnum():
            raise InvalidSettings(
                f"{ENV_STORAGE_OPTIONS}: option {option!r} must name an environment variable "
                f"(letters, digits, _), got {var!r}"
            )
    mv_config, mv_dir = _optional_path(env, ENV_MV_CONFIG), _optional_path(env, ENV_MV_DIR)
    if mv_config and mv_dir:
        raise InvalidSettings(
            f"{ENV_MV_CONFIG} and {ENV_MV_DIR} are both set: set {ENV_MV_DIR} for a folder of "
            f"MV definitions or {ENV_MV_CONFIG} for one file, not both"
        )
    return Settings(
        warehouse_root=_warehouse_root(env),
        vnode_count=_positive_int(env, ENV_VNODE_COUNT, DEFAULT_VNODE_COUNT, MAX_VNODE_COUNT),
        chunk_size=_positive_int(env, ENV_CHUNK_SIZE, DEFAULT_CHUNK_SIZE, 100_000_000),
        spark_master=master,
        spark_conf=_json_object(env, ENV_SPARK_CONF),
        spark_remote=remote,
        spark_driver_host=driver_host,
        spark_class_archive=chosen_path(env.get(ENV_SPARK_CLASS_ARCHIVE)),
        storage_options_env=storage_env,
        mv_config=mv_config,
        mv_dir=mv_dir,
        run_ranges=_positive_int(env, ENV_RUN_RANGES, 1, MAX_VNODE_COUNT),
        continuous=_flag(env, ENV_CONTINUOUS),
        traceback=_flag(env, ENV_TRACEBACK),
        key_cache_mib=_positive_int(env, ENV_KEY_CACHE_MIB, DEFAULT_KEY_CACHE_MIB, 1 << 20),
        test_kill_at=env.get(ENV_TEST_KILL_AT) or None,
        dagster_home=env.get("DAGSTER_HOME") or None,
    )
