"""`dagster dev` in the background, for the latency benchmark and the liveness tests.

Why a helper: started from a script, `dagster dev` ignores SIGTERM/SIGINT unless the default
handlers are restored before exec, and it leaves a daemon, a code server, run workers and their
JVMs behind unless its whole process group is killed. The instance is the project's
`deploy/dagster.yaml` (run monitoring on), copied into the given DAGSTER_HOME.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _restore_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_instance(dagster_home: str) -> None:
    """The project's instance config (run launcher with health check, run monitoring)."""
    import dagster as dg

    os.makedirs(dagster_home, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "deploy", "dagster.yaml"),
                os.path.join(dagster_home, "dagster.yaml"))
    # the instance's storage made here, before dagster dev's processes start: a caller that
    # opened the same instance while they made it raced them to one sqlite schema ("table
    # jobs already exists", seen in tests/reliability/test_follower_kills.py)
    with dg.DagsterInstance.from_config(dagster_home):
        pass


def start(env: dict, log_path: str, port: int | None = None) -> subprocess.Popen:
    """`dagster dev -w workspace.yaml` on a free loopback port (or ``port``), in its own
    process group."""
    install_instance(env["DAGSTER_HOME"])
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
           "-p", str(port or free_port())]
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_restore_signals)


def stop(proc: subprocess.Popen) -> None:
    """Kill dagster dev and everything it started (daemon, code server, runs, JVMs)."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.getpgid(int(pid)) == pgid:
                    return True
            except (ProcessLookupError, PermissionError):
                continue
    return False
