"""Starting and stopping the test servers: loopback only, and they die with the test process.

Why: a test that starts a real server (S3, Spark master/worker, Spark Connect, Postgres) must
never leave it behind, even when pytest is killed. Every server here is started with
``PR_SET_PDEATHSIG = SIGKILL`` (Linux), so the kernel kills it when the pytest process goes, and
the fixture stops it on teardown (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from jobs.ports import LOOPBACK

_PR_SET_PDEATHSIG = 1
class ServerDidNotStart(RuntimeError):
    """A test server did not answer in time; the message carries the end of its log."""


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it exits (runs after the
    uid switch of ``user=``, so it survives it)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setpgrp()  # its own group: teardown signals the server and the children it forked


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: this one minus pyspark's Connect switches (a child that
    inherits SPARK_CONNECT_MODE_ENABLED=1 cannot start a classic session), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"}}
    env.update(extra or {})
    return env


class Server:
    """One started server process, its log file and how to stop it."""

    def __init__(self, name: str, proc: subprocess.Popen, log_path: str) -> None:
        self.name, self.proc, self.log_path = name, proc, log_path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll ``ready`` until true; fail with the log when the server died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDidNotStart(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        self.stop()
        raise ServerDidNotStart(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL it when it has not gone in time."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left in the group, if any


def start(name: str, argv: Sequence[str], log_path: str, env: Mapping[str, str] | None = None,
          user: str | None = None, cwd: str | None = None) -> Server:
    """Start ``argv`` in the background, output to ``log_path``; it dies with this process."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    try:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env or clean_env()),
                                preexec_fn=_die_with_parent, user=user, cwd=cwd)
    finally:
        log.close()
    return Server(name, proc, log_path)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    """Stop ``server`` when the block ends, however it ends."""
    try:
        yield server
    finally:
        server.stop()
