"""upstream_load_job: deterministic per seed, resumable, rate-limited, and runnable with
`dagster job execute -m backfill_assets.definitions -j upstream_load_job -c <config.yaml>`."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest
import yaml

from backfill_assets import storage
from backfill_assets.upstream.writer import LoadParams, read_upstream_spec, row_count, run_load
from jobs.upstream_load import upstream_load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIX = {"insert": 1, "update": 1, "delete": 1, "pk_change": 1, "upsert": 1}


def _content(uri: str) -> list[dict]:
    return sorted(storage.read_table(uri).to_pylist(), key=lambda r: (r["id"], r["region"]))


def test_deterministic_per_seed(warehouse):
    params = LoadParams(seed=5, initial_rows=500, versions=4, changes_per_version=40, mix=MIX)
    a, b, c = (os.path.join(warehouse, n) for n in "abc")
    sa = run_load(a, params, vnode_count=16)
    sb = run_load(b, params, vnode_count=16)
    run_load(c, LoadParams(seed=6, initial_rows=500, versions=4, changes_per_version=40, mix=MIX),
             vnode_count=16)
    assert sa.created and sa.last_version == 5 and sa.versions_written == 5
    assert sa.changes == sb.changes and sum(sa.changes.values()) == 160
    assert all(sa.changes[op] > 0 for op in MIX)
    assert _content(a) == _content(b) != _content(c)
    for v in range(2, 6):
        ca = storage.read_raw_changes(a, v - 1, v).drop_columns(["_commit_timestamp"])
        cb = storage.read_raw_changes(b, v - 1, v).drop_columns(["_commit_timestamp"])
        assert ca.sort_by([("id", "ascending"), ("_change_type", "ascending")]).equals(
            cb.sort_by([("id", "ascending"), ("_change_type", "ascending")]))
    assert sa.row_count == row_count(a) == len(_content(a))


def test_resumes_and_composite_key(warehouse):
    uri = os.path.join(warehouse, "comp")
    first = run_load(uri, LoadParams(seed=1, initial_rows=300, versions=2, changes_per_version=30),
                     vnode_count=8, composite_key=True)
    assert read_upstream_spec(uri).primary_key == ("region", "id")
    again = run_load(uri, LoadParams(seed=1, initial_rows=300, versions=3, changes_per_version=30),
                     vnode_count=8)
    assert not again.created and again.first_version == first.last_version
    assert again.last_version == first.last_version + 3 and again.rows_initial == 0
    keys = [(r["region"], r["id"]) for r in _content(uri)]
    assert len(keys) == len(set(keys)) == again.row_count


def test_rate_limits_versions(warehouse):
    waits: list[float] = []
    run_load(os.path.join(warehouse, "r"),
             LoadParams(seed=0, initial_rows=10, versions=3, changes_per_version=2, rate=2.0),
             vnode_count=4, sleep=waits.append)
    assert len(waits) == 3 and all(0 < w <= 0.5 for w in waits)


def test_bad_mix_is_refused(warehouse):
    with pytest.raises(ValueError, match="unknown op"):
        run_load(os.path.join(warehouse, "m"), LoadParams(mix={"explode": 1}))


def test_example_config_is_valid():
    with open(os.path.join(ROOT, "jobs", "configs", "upstream_load.yaml"), encoding="utf-8") as f:
        run_config = yaml.safe_load(f)
    assert dg.validate_run_config(upstream_load_job, run_config)


@pytest.mark.slow
def test_dagster_job_execute(tmp_path, warehouse, dagster_home):
    config = tmp_path / "load.yaml"
    config.write_text(yaml.safe_dump({"ops": {"upstream_load": {"config": {
        "table": "live", "seed": 11, "initial_rows": 2000, "versions": 3,
        "changes_per_version": 25, "mix": MIX, "vnode_count": 16, "composite_key": True}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    env.update({"BACKFILL_WAREHOUSE": warehouse, "DAGSTER_HOME": dagster_home})
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "backfill_assets.definitions",
         "-j", "upstream_load_job", "-c", str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "RUN_SUCCESS" in out
    uri = os.path.join(warehouse, "live")
    assert storage.latest_version(uri) == 4
    assert read_upstream_spec(uri).vnode_count == 16
    assert row_count(uri) == len(_content(uri))
    assert os.listdir(dagster_home)  # the run was recorded in this instance
