"""Settings: the one place that reads the environment; bad values are named errors."""

from __future__ import annotations

import os

import pytest

from backfill_assets.core.errors import InvalidSettings
from resources.settings import load_settings
from resources.spark import spark_conf, spark_resource
from resources.warehouse import WarehouseResource, warehouse_resource


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings({})
    assert s.warehouse_root == os.path.join(str(tmp_path), "warehouse")
    assert (s.vnode_count, s.chunk_size, s.spark_master) == (256, 10000, "local[*]")
    assert dict(s.spark_conf) == {} and dict(s.storage_options_env) == {}
    assert s.mv_config is None and s.dagster_home is None
    assert s.table_uri("upstream") == os.path.join(str(tmp_path), "warehouse", "upstream")


def test_overrides(tmp_path):
    s = load_settings({
        "BACKFILL_WAREHOUSE": str(tmp_path / "wh"),
        "BACKFILL_VNODE_COUNT": "64",
        "BACKFILL_CHUNK_SIZE": "500",
        "BACKFILL_SPARK_MASTER": "spark://10.0.0.1:7077",
        "BACKFILL_SPARK_CONF": '{"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": 8}',
        "BACKFILL_STORAGE_OPTIONS": '{"aws_access_key_id": "MY_KEY_VAR"}',
        "DAGSTER_HOME": "/tmp/dh",
    })
    assert s.warehouse_root == str(tmp_path / "wh")
    assert (s.vnode_count, s.chunk_size) == (64, 500)
    conf = spark_conf(s)
    assert conf["spark.master"] == "spark://10.0.0.1:7077"
    assert conf["spark.driver.memory"] == "4g" and conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.driver.host"] == "127.0.0.1" and conf["spark.sql.session.timeZone"] == "UTC"
    assert s.dagster_home == "/tmp/dh"
    assert load_settings({"BACKFILL_WAREHOUSE": "s3://bucket/pre/"}).warehouse_root == "s3://bucket/pre"


@pytest.mark.parametrize("var,value,words", [
    ("BACKFILL_VNODE_COUNT", "0", "1 to 32768"),
    ("BACKFILL_VNODE_COUNT", "many", "whole number"),
    ("BACKFILL_VNODE_COUNT", "40000", "32768"),
    ("BACKFILL_CHUNK_SIZE", "-5", "whole number"),
    ("BACKFILL_SPARK_CONF", "{not json", "not valid JSON"),
    ("BACKFILL_SPARK_CONF", "[1, 2]", "JSON object"),
    ("BACKFILL_SPARK_MASTER", "localhost:7077", "local[*]"),
    ("BACKFILL_SPARK_MASTER", "sc://127.0.0.1:15002", "BACKFILL_SPARK_REMOTE"),
    ("BACKFILL_SPARK_REMOTE", "spark://127.0.0.1:7077", "sc://"),
    ("BACKFILL_SPARK_DRIVER_HOST", "bad host", "executors can reach"),
    ("BACKFILL_STORAGE_OPTIONS", '{"aws_secret_access_key": "not a var!"}', "environment variable"),
    ("BACKFILL_WAREHOUSE", "weird scheme://x", "URI"),
])
def test_bad_values_are_named(var, value, words):
    with pytest.raises(InvalidSettings) as err:
        load_settings({var: value})
    assert var in str(err.value) and words in str(err.value)


def test_storage_options_go_through_envvar(monkeypatch):
    monkeypatch.setenv("MY_SECRET_VAR", "s3cr3t")
    res = warehouse_resource(load_settings({
        "BACKFILL_WAREHOUSE": "s3://b/p",
        "BACKFILL_STORAGE_OPTIONS": '{"aws_secret_access_key": "MY_SECRET_VAR"}',
    }))
    import dagster as dg

    assert isinstance(res.storage_options["aws_secret_access_key"], dg.EnvVar)

    @dg.op
    def show(warehouse: WarehouseResource) -> dict:
        return {"uri": warehouse.table_uri("t"), "opts": warehouse.options()}

    @dg.job(resource_defs={"warehouse": res})
    def job():
        show()

    out = job.execute_in_process().output_for_node("show")
    assert out == {"uri": "s3://b/p/t", "opts": {"aws_secret_access_key": "s3cr3t"}}


def test_spark_resource_is_lazy():
    """Building the resource (and loading definitions) never starts a JVM."""
    from pyspark import SparkContext

    res = spark_resource(load_settings({"BACKFILL_SPARK_MASTER": "local[1]"}))
    assert res.spark_config["spark.master"] == "local[1]"
    # if another test already started the shared session this proves nothing; the subprocess
    # test in test_definitions.py checks a fresh interpreter
    if SparkContext._active_spark_context is None:
        assert res._spark_session is None


def test_cluster_and_connect_settings():
    """Scale-out is settings only: a master URL with a routable driver host, or a Connect URL."""
    from resources.spark import REMOTE_KEY, child_env

    s = load_settings({"BACKFILL_SPARK_MASTER": "spark://10.0.0.1:7077",
                       "BACKFILL_SPARK_DRIVER_HOST": "10.0.0.2"})
    conf = spark_conf(s)
    assert conf["spark.master"] == "spark://10.0.0.1:7077" and REMOTE_KEY not in conf
    assert (conf["spark.driver.host"], conf["spark.driver.bindAddress"]) == ("10.0.0.2", "0.0.0.0")
    local = spark_conf(load_settings({}))
    assert (local["spark.driver.host"], local["spark.driver.bindAddress"]) == ("127.0.0.1",) * 2
    remote = spark_conf(load_settings({"BACKFILL_SPARK_REMOTE": "sc://10.0.0.3:15002"}))
    assert remote[REMOTE_KEY] == "sc://10.0.0.3:15002" and "spark.master" not in remote
    assert "spark.driver.host" not in remote
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        assert "SPARK_CONNECT_MODE_ENABLED" not in child_env({"X": "1"})
    finally:
        del os.environ["SPARK_CONNECT_MODE_ENABLED"]


def test_class_archive_is_mapped_by_the_local_driver_only(tmp_path):
    """The driver JVM maps the class archive when the file exists, after any options of the
    user's own; `off` and a Connect session (no local JVM) leave the conf alone."""
    from resources.class_archive import default_path
    from resources.spark import DRIVER_JAVA_OPTIONS

    archive = tmp_path / "classes.jsa"
    named = {"BACKFILL_SPARK_CLASS_ARCHIVE": str(archive),
             "BACKFILL_SPARK_CONF": '{"spark.driver.extraJavaOptions": "-Dx=1"}'}
    assert load_settings({}).spark_class_archive == default_path()
    assert load_settings({"BACKFILL_SPARK_CLASS_ARCHIVE": "off"}).spark_class_archive is None
    assert spark_conf(load_settings(named))[DRIVER_JAVA_OPTIONS] == "-Dx=1"  # no file yet
    archive.write_bytes(b"archive")
    assert spark_conf(load_settings(named))[DRIVER_JAVA_OPTIONS] == \
        f"-Dx=1 -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    remote = spark_conf(load_settings({**named, "BACKFILL_SPARK_REMOTE": "sc://127.0.0.1:1"}))
    assert remote[DRIVER_JAVA_OPTIONS] == "-Dx=1"
    off = spark_conf(load_settings({**named, "BACKFILL_SPARK_CLASS_ARCHIVE": "off"}))
    assert off[DRIVER_JAVA_OPTIONS] == "-Dx=1"


def test_lazy_session_starts_on_first_use():
    from resources.spark import LazySession

    starts = []
    session = LazySession(lambda: starts.append(1) or os)  # any object stands for the session
    assert not session.started and starts == []
    assert session.path is os.path and session.sep == os.sep
    assert session.started and starts == [1]


def test_a_lazy_session_says_where_its_tasks_run_without_starting():
    """``storage.rows.scan.tasks_run_here`` asks a session not started yet where it will run (its
    conf's master): a local master runs a chunk's tasks in the driver's threads, a cluster
    or a Connect session in Spark, and asking starts nothing. Without a conf the answer
    needs the session (started here: any object with a local SparkContext stands for it)."""
    from types import SimpleNamespace

    from backfill_assets.storage.rows.scan import tasks_run_here
    from resources.spark import LazySession, spark_conf

    starts = []
    for conf, here in ((spark_conf(load_settings({"BACKFILL_SPARK_MASTER": "local[2]"})), True),
                       ({"spark.master": "spark://127.0.0.1:7077"}, False),
                       (spark_conf(load_settings({"BACKFILL_SPARK_REMOTE": "sc://127.0.0.1:1"})),
                        False)):
        session = LazySession(lambda: starts.append(1), conf)
        assert tasks_run_here(session) is here and not session.started
    assert starts == []
    unknown = LazySession(lambda: starts.append(1) or SimpleNamespace(
        sparkContext=SimpleNamespace(master="local[*]")))
    assert tasks_run_here(unknown) and unknown.started and starts == [1]
