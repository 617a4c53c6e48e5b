"""bench_bulk's workers, with the snapshot bulk barrier's own work timed as a phase of its
profile: ``storage.write_bulk`` (the vnodes' rows read, projected in Arrow, sorted by (vnode,
key) and encoded as the MV's files by Spark's Python tasks). bench_vs_baselines runs its
snapshot backfill through this module, so a missed bulk target names that phase.

    .venv/bin/python -m benchmarks.vs_bulk worker-backfill --rows 100000 --pk single --mode snapshot
"""

from __future__ import annotations

import sys

from benchmarks import bench_bulk
from benchmarks import common as C

BULK_PHASE = ("bulk: write_bulk (read + project + sort + encode: Python tasks, in driver threads "
              "on a local master)")
_install = C.PhaseProfiler.install


def install(self: C.PhaseProfiler) -> C.PhaseProfiler:
    _install(self)
    from backfill_assets import storage

    self.wrap(storage, "write_bulk", BULK_PHASE)
    return self


if __name__ == "__main__":
    C.PhaseProfiler.install = install  # type: ignore[method-assign]
    sys.exit(bench_bulk.main())
