"""Delta over Spark Connect: what a Connect client can do with our MV and with Delta tables of
its own, against a real Connect server on loopback started with Delta's jars, extension and
catalog (tests/infra/spark_servers.py, resources/delta_jars.py). docs/DELTA_COMPATIBILITY.md
quotes the outcome: reads, time travel, the change feed, history, writes, MERGE and OPTIMIZE
work through SQL and the DataFrame API; the Python ``DeltaTable`` API does not (it needs the
Delta Connect server plugin, which is not published on Maven Central for Spark 4.2).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.mv.owned_tables import MVTables
from resources.spark import child_env
from tests.support import LiveUpstream, simple_mv, simple_row, simple_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.cluster
def test_a_connect_client_reads_our_mv_and_writes_delta(spark, spark_connect, warehouse):
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(4), random.Random(5), simple_row,
                        lambda rng: rng.randint(1, 10_000))
    live.create(rows=60)
    d = simple_mv(4, mode="snapshot")
    tables = MVTables.under(warehouse, d.name, "orders")
    run_barrier(spark, d, tables, range(4))
    live.apply(live.random_batch(8))
    run_barrier(spark, d, tables, range(4))
    env = child_env({"PYTHONPATH": ROOT, "BACKFILL_SPARK_REMOTE": spark_connect.remote_url,
                     "PROBE_MV": tables.mv, "PROBE_SCRATCH": f"{warehouse}/scratch"})
    env.pop("BACKFILL_SPARK_MASTER", None)
    proc = subprocess.run([sys.executable, "-m", "tests.interop.connect_probe"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    facts = json.loads(lines[-1][len("PROBE "):])
    mv = DeltaTable(tables.mv)
    assert facts["mv_rows"] == _rows(mv)
    assert facts["mv_v1_rows"] == _rows(DeltaTable(tables.mv, version=1))
    assert isinstance(facts["mv_feed_rows"], int) and facts["mv_feed_rows"] > 0
    assert facts["mv_history"] == mv.version() + 1
    assert facts["write"] == "ok" and facts["merge"] == "ok" and facts["optimize"] == "ok"
    assert facts["scratch_rows"] == 15
    assert str(facts["python_delta_table"]).startswith("error:"), facts


def _rows(table: DeltaTable) -> int:
    return pa.table(table.scan()).num_rows
