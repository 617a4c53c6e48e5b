"""The allocator settings the package sets before delta-rs loads (storage/store/memory.py):
delta-rs' jemalloc hands pages back after a short decay, and without background threads
(those woke all through a barrier, on the driver's cores).

Checked by effect, in a fresh process that does delta-rs work: the threads jemalloc names
`jemalloc_bg_thd` are counted. Arrow's own jemalloc starts threads of the same name, so the
process turns Arrow's off; the control run, with the setting the package had before, shows
the count would see delta-rs' threads."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
import os, tempfile
import backfill_assets  # sets the allocators' environment before delta-rs loads
import deltalake, pyarrow as pa
folder = tempfile.mkdtemp()
for _ in range(3):
    deltalake.write_deltalake(folder, pa.table({"a": list(range(200_000))}), mode="append")
    deltalake.DeltaTable(folder).to_pyarrow_table()
task = f"/proc/{os.getpid()}/task"
print(sum(open(f"{task}/{t}/comm").read().strip() == "jemalloc_bg_thd"
          for t in os.listdir(task)))
"""


def _background_threads(rjem_conf: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"  # Arrow's own jemalloc
    if rjem_conf is not None:
        env["_RJEM_MALLOC_CONF"] = rjem_conf  # set before the package: it keeps it
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return int(done.stdout.split()[-1])


def test_delta_rs_jemalloc_purges_without_background_threads() -> None:
    import backfill_assets  # noqa: F401  (sets the environment on import)

    conf = os.environ["_RJEM_MALLOC_CONF"].split(",")
    assert "background_thread:false" in conf and "dirty_decay_ms:100" in conf
    assert _background_threads(None) == 0
    # the control: the package's earlier setting (decay only) leaves delta-rs' threads running
    assert _background_threads("dirty_decay_ms:100,muzzy_decay_ms:100") > 0
