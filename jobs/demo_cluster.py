"""`make demo-cluster`: `make demo` beyond one machine, with settings only (README "Scale out").

Starts, on loopback only, an S3-compatible server (moto's server mode) and a Spark standalone
master + one worker (from the pyspark wheel), then runs the demo (jobs/demo.py) in a child
process with nothing but settings changed:

    BACKFILL_WAREHOUSE=s3://backfill-test/demo-<id>      every table on the object store
    BACKFILL_STORAGE_OPTIONS={"AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL", ...}   (EnvVar names)
    BACKFILL_SPARK_MASTER=spark://127.0.0.1:<port>      executors in the worker's JVMs

The demo's driver (the child) commits; the executors write the data files straight to the
store. At the end it prints what the store holds, then stops every server (they also die with
this process: tests/infra/procs.py). The continuous-mode phase runs as in `make demo` (its stop
request is an object under the MV's prefix on the store; DEMO_CONTINUOUS_SECONDS=0 skips it).
The Dagster instance is a throwaway SQLite one (the demo wipes its assets' history).

Sizes: DEMO_ROWS (default 100000) and DEMO_VNODES (16); the servers' logs stay in the printed
work folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CLUSTER_CONF = {"spark.executor.memory": "1g", "spark.driver.memory": "1g"}


def _store_summary(warehouse: str, options: dict[str, str]) -> str:
    from backfill_assets.storage import objects

    found = objects.list_prefix(warehouse, options)
    by_table: dict[str, list[int]] = {}
    for o in found:
        parts = o.uri[len(warehouse) + 1:].split("/")
        table = "/".join(parts[:2]) if parts[0] != "upstream" else "upstream"
        by_table.setdefault(table, []).append(o.size)
    return "\n".join(f"  {t:<32} {len(s):>5} objects {sum(s) / 1e6:8.2f} MB"
                     for t, s in sorted(by_table.items()))


def main() -> int:
    from tests.infra.s3_server import start_s3_server
    from tests.infra.spark_servers import start_cluster

    work = tempfile.mkdtemp(prefix="demo-cluster-")
    print(f"servers' logs and the Dagster instance under {work}")
    t0 = time.monotonic()
    s3 = start_s3_server(work)
    try:
        cluster = start_cluster(work)
    except BaseException:
        s3.stop()
        raise
    try:
        print(f"S3-compatible server (moto) at {s3.endpoint}, Spark master at "
              f"{cluster.master_url} (1 worker), up in {time.monotonic() - t0:.0f} s")
        warehouse = f"{s3.bucket_uri}/demo-{uuid.uuid4().hex[:8]}"
        home = os.path.join(work, "dagster_home")
        os.makedirs(home)
        shutil.copy(os.path.join(ROOT, "deploy", "dagster.yaml"), home)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
        env.update(s3.env())
        env.update({"BACKFILL_WAREHOUSE": warehouse,
                    "BACKFILL_SPARK_MASTER": cluster.master_url,
                    "BACKFILL_SPARK_CONF": json.dumps(CLUSTER_CONF),
                    "DAGSTER_HOME": home, "PYSPARK_PYTHON": sys.executable,
                    "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "DEMO_ROWS": os.environ.get("DEMO_ROWS", "100000"),
                    "DEMO_VNODES": os.environ.get("DEMO_VNODES", "16"),
                    "DEMO_CONTINUOUS_SECONDS": os.environ.get("DEMO_CONTINUOUS_SECONDS", "15")})
        for var in ("BACKFILL_WAREHOUSE", "BACKFILL_SPARK_MASTER", "BACKFILL_STORAGE_OPTIONS"):
            print(f"  {var}={env[var]}")
        rc = subprocess.run([sys.executable, "-m", "jobs.demo"], cwd=ROOT, env=env,
                            check=False).returncode
        print(f"\nthe object store holds (under {warehouse}):\n"
              f"{_store_summary(warehouse, s3.storage_options)}")
        print(f"demo-cluster: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in "
              f"{time.monotonic() - t0:.0f} s; stopping the servers")
        return rc
    finally:
        cluster.stop()
        s3.stop()


if __name__ == "__main__":
    sys.exit(main())
