"""`dagster job execute` / `launch` from tests, and an MV definition file sized for them."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mv_yaml(folder, **overrides) -> str:
    """jobs/configs/mv.yaml with ``overrides`` (chunk_size, vnode_count, ...), written under
    ``folder``; its path, for BACKFILL_MV_CONFIG."""
    with open(os.path.join(ROOT, "jobs", "configs", "mv.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw.update(overrides)
    path = os.path.join(str(folder), "mv.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f)
    return path


def dagster(env: dict, *args: str, timeout: float = 420) -> str:
    """Run ``python -m dagster *args`` in the repo with ``env``; its output (must exit 0)."""
    proc = subprocess.run([sys.executable, "-m", "dagster", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


def execute(env: dict, job: str) -> str:
    """``dagster job execute`` of ``job`` from the definitions module; must succeed."""
    out = dagster(env, "job", "execute", "-m", "backfill_assets.definitions", "-j", job)
    assert "RUN_SUCCESS" in out, out[-5000:]
    return out
