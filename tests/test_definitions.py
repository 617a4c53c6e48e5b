"""The definitions load (as `dagster dev` / `dagster job execute` would) without starting Spark."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_definitions_load_without_a_jvm(tmp_path):
    code = (
        "import backfill_assets.definitions as d\n"
        "from pyspark import SparkContext\n"
        "defs = d.defs\n"
        "job = defs.get_job_def('upstream_load_job')\n"
        "assert job is not None\n"
        "assert set(defs.resources) >= {'spark', 'warehouse'}\n"
        "assert SparkContext._gateway is None and SparkContext._active_spark_context is None\n"
        "print('ok', d.settings.warehouse_root)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "BACKFILL_WAREHOUSE": str(tmp_path / "wh"),
           "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"ok {tmp_path / 'wh'}"


def test_workspace_and_pyproject_point_at_the_definitions():
    import tomllib

    import yaml

    with open(f"{ROOT}/pyproject.toml", "rb") as f:
        py = tomllib.load(f)
    assert py["tool"]["dagster"]["module_name"] == "backfill_assets.definitions"
    assert py["tool"]["dg"]["project"]["root_module"] == "backfill_assets"
    with open(f"{ROOT}/workspace.yaml", encoding="utf-8") as f:
        ws = yaml.safe_load(f)
    assert ws["load_from"][0]["python_module"]["module_name"] == "backfill_assets.definitions"
