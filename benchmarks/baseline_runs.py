"""How the issue-38 baselines run their workers: each in a fresh process under
`flock $BENCH_LOCK`, like every benchmark (benchmarks.common.run_worker), except when the
whole driver already runs under that lock (`flock /tmp/spark.lock python -m
benchmarks.baseline_delta_spark ...`): a second flock on the same file from the worker would
wait for its own parent forever, so the workers then run without one."""

from __future__ import annotations

import os
from collections.abc import Sequence

from benchmarks import common as C


def load_note() -> str:
    """The machine's load average (1, 5, 15 min), as `uptime` prints it."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def lock_held_above(lock: str = C.LOCK) -> bool:
    """Whether an ancestor of this process is `flock <lock> ...` (it holds the lock for us)."""
    target = os.path.realpath(lock)
    pid = os.getppid()
    while pid > 1:
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) == "flock" and any(
                os.path.realpath(a) == target for a in argv[1:3]):
            return True
        pid = _parent(pid)
    return False


def run(module: str, args: Sequence[str], *, threshold: float = 0.10,
        retry_below_s: float = 400) -> dict:
    """benchmarks.common.run_clean with the lock rule above: the worker once more when other
    processes used more than `threshold` of the CPU while it measured (short workers only)."""
    lock = not lock_held_above()
    result = C.run_worker(module, args, lock=lock)
    share = result.get("foreign_cpu_share") or 0.0
    if share > threshold and (result.get("seconds") or 0.0) < retry_below_s:
        print(f"    ({100 * share:.0f}% of the CPU went to other processes: measuring again)",
              flush=True)
        again = C.run_worker(module, args, lock=lock)
        again.update(attempts=2, first_attempt_foreign_cpu_share=share)
        return again
    return result


def prepare(rows: int, pk: str, vnodes: int) -> None:
    """The cached upstream of `rows` rows (bench_bulk's worker-prepare, in its own process)."""
    C.run_worker("benchmarks.bench_bulk", ["worker-prepare", "--rows", str(rows), "--pk", pk,
                                           "--vnodes", str(vnodes)],
                 lock=not lock_held_above())
