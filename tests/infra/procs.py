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
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
# free_port's ports: a block of PORT_BLOCK per test process from PORT_BASE up, below the
# kernel's ephemeral range (Linux default 32768-60999)
PORT_BASE = 20000
PORT_BLOCK = 500
_ports_lock = threading.Lock()
_ports_given: set[int] = set()
_ports_cursor: list[int] = []


class ServerDidNotStart(RuntimeError):
    """A test server did not answer in time; the message carries the end of its log."""


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_block() -> range:
    """This process's ports: block 0 without pytest-xdist, block N+1 for worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = PORT_BASE + index * PORT_BLOCK
    return range(start, start + PORT_BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on loopback right now (the server binds it a moment later).

    Why not bind(0): the port is free only until the server binds it, and meanwhile the kernel
    may hand it to anyone else's bind(0) or outgoing connection - the other pytest-xdist
    worker's servers, Spark drivers and executors, JVM and gRPC clients. A port of this
    process's own block below the ephemeral range is taken by none of them, and this process
    never hands the same port out twice (a master's RPC and UI ports, two servers).
    """
    block = _port_block()
    with _ports_lock:
        if block.stop <= _ephemeral_low():
            if not _ports_cursor:  # a random start: two test runs side by side rarely meet
                _ports_cursor.append(random.randrange(len(block)))
            for _ in range(len(block)):
                port = block[_ports_cursor[0] % len(block)]
                _ports_cursor[0] += 1
                if port not in _ports_given and _bindable(port):
                    _ports_given.add(port)
                    return port
        while True:  # no block (many workers, or a low ephemeral range): the kernel's choice
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port = int(sock.getsockname()[1])
            if port not in _ports_given:
                _ports_given.add(port)
                return port


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
