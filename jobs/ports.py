"""Loopback ports this process hands out: `dagster dev` (jobs/dagster_dev.py) and the servers
the tests start (tests/infra/procs.py) take theirs here, so no two of them get the same one."""

from __future__ import annotations

import os
import random
import socket
import threading

LOOPBACK = "127.0.0.1"
# free_port's ports: a block of PORT_BLOCK per process (each pytest-xdist worker its own) from
# PORT_BASE up, below the kernel's ephemeral range (Linux default 32768-60999)
PORT_BASE = 20000
PORT_BLOCK = 500
_ports_lock = threading.Lock()
_ports_given: set[int] = set()
_ports_cursor: list[int] = []


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
