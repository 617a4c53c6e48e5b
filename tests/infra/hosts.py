"""Hosts of their own: Linux network namespaces on a bridge, each with a private /tmp.

Why: on one machine's 127.0.0.1 with one filesystem, a path written on the driver and read on
an executor, an address that only works on loopback or a temp file assumed visible everywhere
all go unnoticed. Here every host is a network namespace with its own address on a private test
subnet, joined to the others by a bridge that lives in a namespace of its own (the machine's own
interfaces, routes and addresses are never touched, and nothing outside these namespaces is ever
a target). Every process started on a host also gets a mount namespace (``unshare --mount``)
in which /tmp, /var/tmp and $HOME are that host's private folder, /dev/shm is empty, and the
repository and the Python environment are read-only: the only thing hosts share is the network.

Faults are what an operator meets: ``cut``/``mend`` takes a host's link down and up (the host
keeps running but nobody reaches it), ``kill_all`` SIGKILLs every process in the host.
``close`` kills every process and deletes every namespace (the bridge goes with its namespace);
namespaces a killed test process left behind are removed by the next ``Network``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tests.infra import procs

PREFIX = "bfh"  # every namespace this harness makes starts with it (and the owner's pid)
SUBNET = "10.213.0"  # a private /24 that exists only inside this harness's namespaces
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME = os.path.expanduser("~")
# the folders every host sees read-only: the repository, the Python environment and the
# interpreter it was made from (which may live under $HOME, e.g. pyenv's)
READ_ONLY = tuple(dict.fromkeys(os.path.realpath(p)
                                for p in (ROOT, sys.prefix, sys.base_prefix)))
# those under $HOME: mounted again inside the host's private home
HOME_READ_ONLY = tuple(os.path.relpath(p, HOME) for p in READ_ONLY
                       if p.startswith(HOME.rstrip("/") + "/"))
# inside a host: its private folder on /tmp, /var/tmp and $HOME; the code read-only
_MOUNTS = """set -e
mount --make-rprivate /
for ro in $BFH_READ_ONLY; do mount --bind "$ro" "$ro"; mount -o remount,bind,ro "$ro"; done
mount -t tmpfs -o size=256m tmpfs /dev/shm
for rel in $BFH_HOME_RO; do mount --bind "$BFH_HOME/$rel" "$BFH_PRIVATE/home/$rel"; done
mount --rbind "$BFH_PRIVATE/home" "$BFH_HOME"
mount --bind "$BFH_PRIVATE/tmp" /var/tmp
mount --bind "$BFH_PRIVATE/tmp" /tmp
unset BFH_PRIVATE BFH_HOME BFH_READ_ONLY BFH_HOME_RO
cd /tmp
exec "$@"
"""


class HostsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, or no ip/unshare)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def available() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    missing = [tool for tool in ("ip", "unshare", "nsenter") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)} (packages iproute2, util-linux)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


@dataclass
class Host:
    """One host: its namespace, address, private folder (its /tmp, seen from outside at
    ``tmp``) and the name of its link on the bridge."""

    name: str
    ns: str
    address: str
    private: str
    link: str

    @property
    def tmp(self) -> str:
        """The host's /tmp as seen from the test (write its input files here)."""
        return os.path.join(self.private, "tmp")

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this host: its network namespace, then a mount namespace of its
        own with the private folders mounted (_MOUNTS)."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation",
                "private", "--", "sh", "-c", _MOUNTS, "host", *argv]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A child's environment on this host: its address for Spark, its own temp folders,
        the project on PYTHONPATH, and the variables _MOUNTS reads."""
        env = procs.clean_env({
            "SPARK_LOCAL_IP": self.address, "TMPDIR": "/tmp", "HOME": HOME,
            "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1",
            "BFH_PRIVATE": self.private, "BFH_HOME": HOME, "BFH_READ_ONLY": " ".join(READ_ONLY),
            "BFH_HOME_RO": " ".join(HOME_READ_ONLY),
        })
        env.update(extra or {})
        return env

    def start(self, name: str, argv: Sequence[str],
              env: Mapping[str, str] | None = None) -> procs.Server:
        """Start a server process on this host; its log is ``<tmp>/<name>.log``."""
        return procs.start(f"{self.name}/{name}", self.argv(argv),
                           os.path.join(self.tmp, f"{name}.log"), env=self.env(env))

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host to its end; its output as text (not checked)."""
        return subprocess.run(self.argv(argv), env=self.env(env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def python(self, module: str, *args: str, env: Mapping[str, str] | None = None,
               timeout: float = 300) -> str:
        """``python -m module args`` on this host; its stdout (it must exit 0)."""
        proc = self.run([sys.executable, "-m", module, *args], env=env, timeout=timeout)
        assert proc.returncode == 0, (f"{module} on {self.name} exited {proc.returncode}",
                                      proc.stdout[-3000:], proc.stderr[-5000:])
        return proc.stdout

    def pids(self) -> list[int]:
        """Every process in this host's network namespace."""
        out = _ip("netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> None:
        """SIGKILL every process of this host, as a power cut does (until none is left)."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def listening(self) -> dict[int, str]:
        """Port -> the listening process (``ss -p``'s users) of every TCP socket listening in
        this host on an address other than loopback."""
        out = self.run(["ss", "-Hltnp"], timeout=30).stdout
        found = {}
        for line in out.splitlines():
            fields = line.split()
            addr, _, port = fields[3].rpartition(":")
            # a JVM's IPv4 sockets show as IPv4-mapped IPv6 ([::ffff:127.0.0.1])
            addr = addr.strip("[]").split("%")[0].removeprefix("::ffff:")
            if not (addr.startswith("127.") or addr == "::1"):
                found[int(port)] = f"{addr} {' '.join(fields[5:])}"
        return found


class Network:
    """A bridge in a namespace of its own and the hosts on it (addresses SUBNET.2 up)."""

    def __init__(self, base_dir: str) -> None:
        reason = available()
        if reason:
            raise HostsUnavailable(reason)
        remove_stale()
        self.base_dir = base_dir
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._servers: list[procs.Server] = []
        _ip("netns", "add", self.switch)
        try:
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> Host:
        """A new host on the bridge with the next address and an empty private folder."""
        index = len(self.hosts) + 2
        host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{index}",
                    os.path.join(self.base_dir, name), f"p{index}")
        for sub in ("tmp", "home", *(os.path.join("home", rel) for rel in HOME_READ_ONLY)):
            os.makedirs(os.path.join(host.private, sub), exist_ok=True)
        self.hosts[name] = host
        _ip("netns", "add", host.ns)
        _ip("-n", self.switch, "link", "add", host.link, "type", "veth",
            "peer", "name", "eth0", "netns", host.ns)
        _ip("-n", self.switch, "link", "set", host.link, "master", "br0", "up")
        _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")  # Spark's Python workers talk on it
        return host

    def cut(self, host: Host) -> None:
        """Take the host's link down at the bridge: it runs on, unreachable."""
        _ip("-n", self.switch, "link", "set", host.link, "down")

    def mend(self, host: Host) -> None:
        """Bring the host's link back up."""
        _ip("-n", self.switch, "link", "set", host.link, "up")

    def keep(self, server: procs.Server) -> procs.Server:
        """Stop ``server`` on close (processes started with Host.start)."""
        self._servers.append(server)
        return server

    def close(self) -> None:
        """Stop the servers, kill whatever else runs in a host, delete every namespace."""
        for server in reversed(self._servers):
            with contextlib.suppress(Exception):
                server.stop(timeout=5)
        for host in self.hosts.values():
            host.kill_all()
            _ip("netns", "del", host.ns, check=False)
        _ip("netns", "del", self.switch, check=False)


def remove_stale() -> None:
    """Delete the namespaces of harness processes that are gone (a test process killed
    before its teardown), killing what still runs in them."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        owner = name[len(PREFIX):].split("-")[0] if name.startswith(PREFIX) else ""
        if not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
