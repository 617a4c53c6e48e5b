"""Every command block of the README runs as written, after `make demo`, in a copy of the tree.

The blocks are taken from README.md as it is (```bash and ```python fences), so a block that
is added or edited is run too. In a copy of the working tree (the venv shared, file times kept
so `make` does not reinstall it; its own warehouse, DAGSTER_HOME and demo.env), with no
BACKFILL_* or DAGSTER_HOME from this process's environment:
- the first block's `make demo` runs first (DEMO_ROWS smaller, the one change), and its
  `make test` is this very suite, so it is not run again;
- a block that starts `make ui` is run until the UI answers on its port and shows the demo as
  the demo left it (the sensor runs no barrier, the verification is shown), then stopped;
- every other bash block runs with `bash -e`, every python block with the venv's Python, from
  the copy's root; each must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from jobs.dagster_dev import ROOT
from jobs.ports import free_port

FENCE = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
DEMO_ROWS = "30000"
DEMO_MVS = ("orders_mv", "big_orders", "eu_orders", "revenue_by_region_day",
            "revenue_by_segment")  # jobs/configs/mvs


def blocks(path: str = os.path.join(ROOT, "README.md")) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        return [(m.group(1), m.group(2)) for m in FENCE.finditer(f.read())]


def _copy_tree(dst: str) -> None:
    """The working tree's files (tracked and new, not ignored), times kept; the venv linked."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = os.path.join(ROOT, name)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, name))
    os.symlink(os.path.join(ROOT, ".venv"), os.path.join(dst, ".venv"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BACKFILL_", "DEMO_")) and k != "DAGSTER_HOME"}
    # the venv is shared: never let make reinstall it from the copy (make ignores -o in
    # MAKEFLAGS, so the Makefile reads BACKFILL_SHARED_VENV; every make a block starts sees it)
    return {**env, "DEMO_ROWS": DEMO_ROWS, "BACKFILL_SHARED_VENV": "1"}


def _run(cmd: list[str], cwd: str, env: dict, timeout: float = 900) -> str:
    """Run to the end; its output through a file, not a pipe: Dagster's compute-log capture
    leaves `tail -F` children that would hold a pipe open after the command ended."""
    path = os.path.join(cwd, "block.log")
    with open(path, "wb") as log:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout).returncode
    with open(path, encoding="utf-8", errors="replace") as f:
        out = f.read()
    assert code == 0, f"{cmd!r} exited {code}:\n{out[-4000:]}"
    return out


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole group (make, dagster dev's webserver, daemon, code server), then
    SIGKILL to whatever is left of it."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the group's leader, so it does not linger as a zombie
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_leftovers(tree: str) -> None:
    """Processes still running in the copy (a compute log's `tail -F`, a server): SIGKILL."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(tree):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


SENSOR_TICKS = """{ repositoriesOrError { ... on RepositoryConnection { nodes { sensors {
  name sensorState { ticks(limit: 5) { status skipReason } } } } } } }"""


def _demo_shown_as_left(url: str) -> None:
    """`make ui` after `make demo`: the sensor's first tick runs no barrier (every MV is
    finished at its upstream's latest version) and each MV's matches_oracle shows the demo's
    verification."""
    from jobs.dagster_dev import graphql
    from tests.test_ui import CHECK_NAME, CHECK_STATUS

    def ticks() -> list[dict]:
        return [t for repo in graphql(url, SENSOR_TICKS)["repositoriesOrError"]["nodes"]
                for sensor in repo["sensors"] for t in sensor["sensorState"]["ticks"]]

    deadline = time.monotonic() + 120
    while not [t for t in ticks() if t["status"] != "STARTED"]:
        assert time.monotonic() < deadline, "the barrier sensor never ticked"
        time.sleep(3)
    done = [t for t in ticks() if t["status"] != "STARTED"]
    assert all(t["status"] == "SKIPPED" for t in done), done
    for mv in DEMO_MVS:  # one sensor for the catalog: each MV idle, each verification shown
        assert f"{mv}: at its upstream's latest version" in done[0]["skipReason"], done
        assert "finished" in done[0]["skipReason"], done
        shown = graphql(url, CHECK_STATUS, {"keys": [{"path": [mv, "downstream_mv"]}]})
        checks = {c["name"]: c["executionForLatestMaterialization"]
                  for c in shown["assetNodes"][0]["assetChecksOrError"]["checks"]}
        assert checks[CHECK_NAME] and checks[CHECK_NAME]["status"] == "SUCCEEDED", checks


def _serve_ui(block: str, cwd: str, env: dict) -> None:
    """Run the block (it execs `dagster dev`) until the UI answers and shows the demo as the
    demo left it, then stop its group."""
    port = free_port()
    env = {**env, "UI_PORT": str(port)}
    with open(os.path.join(cwd, "make_ui.log"), "wb") as log:
        proc = subprocess.Popen(["bash", "-ec", block], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_default_signals)  # dagster dev then obeys SIGTERM
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, open(os.path.join(cwd, "make_ui.log")).read()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info",
                                            timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(2)
        else:
            raise AssertionError("make ui did not answer: "
                                 + open(os.path.join(cwd, "make_ui.log")).read()[-3000:])
        _demo_shown_as_left(f"http://127.0.0.1:{port}")
    finally:
        _stop_group(proc)


@pytest.mark.slow
def test_every_readme_block_runs_as_written(tmp_path):
    found = blocks()
    assert found and "make demo" in found[0][1], "the first block must be the two commands"
    copy = str(tmp_path / "tree")
    _copy_tree(copy)
    env = _env()
    try:
        out = _run(["make", "demo"], copy, env, timeout=1800)
        for mv in DEMO_MVS:
            assert f"verify_job: MV {mv!r}: verified" in out, out[-3000:]
        assert "0 mismatches" in out and "FAILED" not in out, out[-3000:]
        for kind, block in found[1:]:
            if kind == "python":
                _run([PYTHON, "-c", block], copy, env)
            elif re.search(r"^\s*make ui\b", block, re.M):
                _serve_ui(block, copy, env)
            else:
                _run(["bash", "-ec", block], copy, env)
    finally:
        _stop_leftovers(copy)
