"""Dagster's default run launcher plus a worker health check, so run monitoring can see deaths.

Why: run monitoring only marks a vanished run FAILURE when the launcher can check its worker,
and `DefaultRunLauncher` cannot. Without it a SIGKILLed `dagster job execute` run (or a run
whose code server died with it) stays STARTED for ever, and the barrier sensor, which trusts run
status, would never restart its follower. Every run of this platform executes in-process and
records its pid in an engine event ("Executing steps in process (pid: N)"); the check looks that
process up. It is a same-host check (the embedded default); a deployment that runs workers
elsewhere uses a launcher with its own health check (Docker, Kubernetes, ECS).

Configured in the project's `deploy/dagster.yaml` (`make env`/`make ui` install it into
DAGSTER_HOME).
"""

from __future__ import annotations

import os

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus

START_SLACK_SECONDS = 2.0  # a pid whose process started later than this after the event: reused


class PidCheckingRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose workers run monitoring can check (by pid, on this host)."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        recorded = worker_pid(self._instance, run.run_id)
        if recorded is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker pid recorded yet")
        pid, since = recorded
        if process_alive(pid, since):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"worker pid {pid} is alive")
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"the run's worker process (pid {pid}) is gone: it was killed "
                                 "or crashed; a rerun recovers every half-done barrier")


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """(pid, event time) of the last engine event of the run that names its process."""
    events = instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
    for entry in reversed(events):
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        meta = getattr(data, "metadata", None) or {}
        if "pid" in meta:
            return int(meta["pid"].value), entry.timestamp
    return None


def process_alive(pid: int, not_after: float) -> bool:
    """The process `pid` exists, is not a zombie and started before `not_after` (+ slack):
    a pid reused by a later process does not count."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if fields[0] in ("Z", "X"):
        return False
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= not_after + START_SLACK_SECONDS


def _boot_time() -> float:
    with open("/proc/stat", encoding="utf-8") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0
