"""How the issue-38 baselines run their workers: each in a fresh process under
`flock $BENCH_LOCK`, like every benchmark (benchmarks.common.run_worker, which leaves the
flock out when the whole driver already runs under that lock), measured again when other
processes took the CPU meanwhile."""

from __future__ import annotations

import os
from collections.abc import Sequence

from benchmarks import common as C


def load_note() -> str:
    """The machine's load average (1, 5, 15 min), as `uptime` prints it."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run(module: str, args: Sequence[str], *, threshold: float = 0.10,
        retry_below_s: float = 400) -> dict:
    """benchmarks.common.run_clean's rule: the worker once more when other processes used
    more than `threshold` of the CPU while it measured (short workers only)."""
    result = C.run_worker(module, args)
    share = result.get("foreign_cpu_share") or 0.0
    if share > threshold and (result.get("seconds") or 0.0) < retry_below_s:
        print(f"    ({100 * share:.0f}% of the CPU went to other processes: measuring again)",
              flush=True)
        again = C.run_worker(module, args)
        again.update(attempts=2, first_attempt_foreign_cpu_share=share)
        return again
    return result


def prepare(rows: int, pk: str, vnodes: int) -> None:
    """The cached upstream of `rows` rows (bench_bulk's worker-prepare, in its own process)."""
    C.run_worker("benchmarks.bench_bulk", ["worker-prepare", "--rows", str(rows), "--pk", pk,
                                           "--vnodes", str(vnodes)])
