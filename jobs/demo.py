"""`make demo`: run the platform's main job on the embedded default and print a summary.

For now the main job is the load generator (the backfill job replaces it): it runs
``dagster job execute -m backfill_assets.definitions -j upstream_load_job -c
jobs/configs/upstream_load.yaml`` exactly as a user would, keeps Dagster's log in
``$DAGSTER_HOME/demo.log``, and prints the upstream's versions and row counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from backfill_assets.load_generator import versions_summary
from resources.settings import load_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join("jobs", "configs", "upstream_load.yaml")
TABLE = "upstream"


def main() -> int:
    settings = load_settings()
    home = os.environ.setdefault("DAGSTER_HOME", os.path.join(ROOT, ".dagster_home"))
    os.makedirs(home, exist_ok=True)
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "backfill_assets.definitions",
           "-j", "upstream_load_job", "-c", CONFIG]
    log_path = os.path.join(home, "demo.log")
    print(f"warehouse: {settings.warehouse_root}\nDAGSTER_HOME: {home}")
    print("$ " + " ".join(["dagster", *cmd[3:]]), flush=True)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - started
    with open(log_path, encoding="utf-8") as log:
        lines = log.read().splitlines()
    if proc.returncode != 0:
        print("\n".join(lines[-40:]))
        print(f"upstream_load_job FAILED (exit {proc.returncode}); full log: {log_path}")
        return proc.returncode
    for line in lines:
        if " - upstream_load - " in line and " INFO - " in line:
            print("  " + line.split(" INFO - ", 1)[1].split(" - upstream_load - ", 1)[-1])
    print(f"upstream_load_job succeeded in {elapsed:.1f}s (log: {log_path})\n")
    uri = settings.table_uri(TABLE)
    print(f"upstream table {uri} (newest versions first)")
    print(f"{'version':>8}  {'operation':<14} {'rows':>10}  changes")
    for v in versions_summary(uri, limit=12):
        dml = v["dml"] or {}
        changes = ", ".join(f"{k} {n}" for k, n in dml.items() if n) if dml else ""
        print(f"{v['version']:>8}  {str(v['operation']):<14} {v['rows']:>10}  {changes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
