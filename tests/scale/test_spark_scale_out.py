"""The Spark resource on a real standalone cluster and as a Spark Connect client.

Settings only (BACKFILL_SPARK_MASTER / BACKFILL_SPARK_REMOTE), in a separate driver process
(tests/infra/spark_probe.py) the way a Dagster run builds its session: Python UDFs and Arrow
tasks run in other processes than the driver, and tasks write parquet files straight to the
S3-compatible server with the storage options they were handed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from resources.spark import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def run_probe(env: dict[str, str], timeout: float = 240) -> dict:
    """Run the probe driver with ``env`` on top of this environment; its facts as a dict."""
    base = child_env({"PYTHONPATH": ROOT, "BACKFILL_SPARK_CONF": json.dumps(
        {"spark.executor.memory": "1g", "spark.driver.memory": "1g"})})
    for var in ("BACKFILL_SPARK_MASTER", "BACKFILL_SPARK_REMOTE"):
        base.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "tests.infra.spark_probe"], cwd=ROOT,
                          env={**base, **env}, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    # the lines that say what went wrong first (pytest cuts a long message in its middle)
    errors = [ln for ln in proc.stderr.splitlines()
              if "Error" in ln or "Exception" in ln or "Caused by" in ln][:12]
    assert proc.returncode == 0 and lines, ("\n".join(errors), proc.stdout[-2000:],
                                            proc.stderr[-3000:])
    facts = json.loads(lines[-1][len("PROBE "):])
    # shown in the warnings summary: what the probe saw (e.g. empty_list_ok, see the probe)
    warnings.warn(f"spark probe facts: {facts}", stacklevel=2)
    return facts


def _check_remote_work(facts: dict, rows: int = 1000) -> None:
    pids = {int(e.split("|")[0]) for e in facts["executors"]}
    assert facts["driver_pid"] not in pids  # UDFs ran in Python workers of other processes
    assert {e.split("|", 1)[1] for e in facts["executors"]} == {sys.executable}
    assert facts["rows_written"] == rows and facts["empty_rows"] == 0


@pytest.mark.parametrize("spark", ["standalone", "connect"])
def test_resource_runs_jobs_and_tasks_write_to_the_store(spark, s3_server, request):
    """standalone: BACKFILL_SPARK_MASTER=spark://...; connect: BACKFILL_SPARK_REMOTE=sc://..."""
    if spark == "standalone":
        cluster = request.getfixturevalue("spark_cluster")
        setting = {"BACKFILL_SPARK_MASTER": cluster.master_url}
    else:
        setting = {"BACKFILL_SPARK_REMOTE": request.getfixturevalue("spark_connect").remote_url}
    facts = run_probe({**setting, "PROBE_TABLE_URI": s3_server.fresh_uri(f"{spark}-probe"),
                       "PROBE_STORAGE_OPTIONS": json.dumps(s3_server.storage_options)})
    _check_remote_work(facts)
    assert facts["files"] == 4  # one parquet file per task, on the store, listed by the driver
    assert facts["empty_list_ok"] is True  # createDataFrame([], struct) works on both
    if spark == "standalone":
        assert facts["master"] == cluster.master_url and not facts["connect"]
        # the executors ran in executor JVMs the worker launched
        assert "Launching executor" in cluster.worker.log_tail(50000) or \
            "Asked to launch executor" in cluster.worker.log_tail(50000)
    else:
        assert facts["connect"] and facts["master"] is None
