"""Start `dagster dev` on a free loopback port, talk to its GraphQL API, stop it.

Used by the UI test (what a user sees, asked through GraphQL), the screenshot script, the
follower-kill tests and the latency benchmark (`start` / `stop` where the caller holds the
process itself; `install_instance` gives a DAGSTER_HOME the project's `deploy/dagster.yaml`).
`dagster dev` started from a script ignores SIGTERM/SIGINT unless the default handlers are
restored before exec (docs/DESIGN.md, "Facts the code relies on"); it also starts a
webserver, a daemon and a code server, so it runs in its own session and the whole process
group is stopped.

`quiet=True` serves a state without changing it: the barrier sensor is on by default and its
first tick would queue a barrier (a Spark run) that marks every vnode "materializing". The
instance gets a run queue that launches nothing, the sensors are stopped once the code
location has loaded, and any run they queued meanwhile is canceled and deleted (it never
started, so nothing of it remains). `launches=True` keeps the queue open (the sensors still
held), for runs a test launches from the UI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import yaml

from jobs.ports import free_port

SENSOR_TICK_SECONDS = 6  # the daemon evaluates a sensor at most every 5 s
TICK_END_TIMEOUT = 120.0  # a tick under way when the sensors were stopped (a loaded machine)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCATION_LOADED = "{ workspaceOrError { ... on Workspace { locationEntries { name " \
                  "locationOrLoadError { __typename } } } } }"


class DagsterDevFailed(RuntimeError):
    """`dagster dev` did not come up; the message carries the end of its log."""


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SENSORS = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
  sensors { name sensorState { id status ticks(limit: 1) { status } } } } } } }"""
QUEUED = """{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED]}) {
  ... on Runs { results { runId } } } }"""
STOP_SENSOR = "mutation Stop($id: String!) { stopSensor(id: $id) { __typename } }"
CANCEL = "mutation Cancel($ids: [String!]!) { terminateRuns(runIds: $ids) { __typename } }"
DELETE = "mutation Delete($id: String!) { deleteRun(runId: $id) { __typename } }"


def hold_the_queue(home: str) -> None:
    """Dequeue nothing (quiet): the instance's limit on all runs at once set to 0, wherever
    its dagster.yaml keeps it (`concurrency.runs`, or an older `run_queue`)."""
    path = os.path.join(home, "dagster.yaml")
    config: dict = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    section = config["run_queue"] if "run_queue" in config else \
        config.setdefault("concurrency", {}).setdefault("runs", {})
    section["max_concurrent_runs"] = 0
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)


@contextmanager
def dagster_dev(env: Mapping[str, str], log_path: str, timeout: float = 180.0,
                quiet: bool = False, port: int | None = None,
                launches: bool = False) -> Iterator[str]:
    """Serve `workspace.yaml` with `env` (settings + DAGSTER_HOME); yields the base URL once
    the code location has loaded, and stops every process of the server afterwards. ``port``:
    the webserver's (default: `jobs.ports.free_port`). ``launches`` (with ``quiet``): the
    sensors are held still but runs launched from the UI do run (the browser test's)."""
    if quiet and not launches:
        hold_the_queue(env["DAGSTER_HOME"])
    port = port or free_port()
    proc = start(env, log_path, port)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_loaded(url, proc, log_path, timeout)
        if quiet:
            _hold_still(url)
        yield url
    finally:
        stop(proc)


def install_instance(dagster_home: str) -> None:
    """The project's instance config (run launcher with a pid check, run monitoring) in
    ``dagster_home``, its storage made before any server process starts: a caller that opened
    the same instance while `dagster dev` made it would race it to one sqlite schema."""
    import dagster as dg

    os.makedirs(dagster_home, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "deploy", "dagster.yaml"),
                os.path.join(dagster_home, "dagster.yaml"))
    with dg.DagsterInstance.from_config(dagster_home):
        pass


def start(env: Mapping[str, str], log_path: str, port: int | None = None) -> subprocess.Popen:
    """`dagster dev -w workspace.yaml` on loopback (``port``, default one the kernel says is
    free), in its own session so that `stop` reaches every process it starts."""
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml",
           "-h", "127.0.0.1", "-p", str(port or free_port())]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=dict(env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_default_signals)


def _wait_loaded(url: str, proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            entries = graphql(url, LOCATION_LOADED)["workspaceOrError"]["locationEntries"]
            kinds = [e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"]
                     for e in entries]
            if kinds and all(k == "RepositoryLocation" for k in kinds):
                return
            if any(k == "PythonError" for k in kinds):
                break
        except (OSError, urllib.error.URLError, KeyError, TypeError):
            pass
        time.sleep(1.0)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-3000:]
    raise DagsterDevFailed(f"dagster dev did not load the code location at {url}: {tail}")


def _sensors(url: str) -> list[dict]:
    return [s for repo in graphql(url, SENSORS)["repositoriesOrError"]["nodes"]
            for s in repo["sensors"]]


def _hold_still(url: str) -> None:
    """Stop every sensor, let a tick under way finish, drop what the sensors queued."""
    for sensor in _sensors(url):
        if sensor["sensorState"]["status"] == "RUNNING":
            graphql(url, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
    time.sleep(SENSOR_TICK_SECONDS)
    # a tick that began before the stop may still be evaluating (longer than a tick interval
    # on a busy machine): wait until none is STARTED, or it would queue a run after the cleanup
    deadline = time.monotonic() + TICK_END_TIMEOUT
    while time.monotonic() < deadline and any(
            t["status"] == "STARTED" for s in _sensors(url) for t in s["sensorState"]["ticks"]):
        time.sleep(1.0)
    queued = [r["runId"] for r in graphql(url, QUEUED)["runsOrError"]["results"]]
    if queued:
        graphql(url, CANCEL, {"ids": queued})
    for run_id in queued:
        graphql(url, DELETE, {"id": run_id})


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole group (webserver, daemon, code server, run workers and their
    JVMs), SIGKILL if any of it lingers: returns once no process of the group is left."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (a run worker outlives the webserver)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def graphql(url: str, query: str, variables: Mapping | None = None) -> dict:
    """POST one GraphQL query to the webserver; its `data`, or an error naming the problem."""
    body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # a malformed query: say which and why
        raise RuntimeError(f"GraphQL {exc.code}: {exc.read()[:2000]!r} for {query}") from None
    if answer.get("errors"):
        raise RuntimeError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]
