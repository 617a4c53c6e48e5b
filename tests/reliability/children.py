"""The reliability tests' child processes (harness.py re-exports them): `dagster job execute
... -j backfill_job` (the real wiring) and a light child (`python -m
tests.reliability.children '<json>'`) that calls `run_barrier` with
`testing.kill_hook.kill_hook` and, for the concurrency tests, a file rendezvous that holds both
runs at a point until both reached it.

Children are plain processes started with `subprocess`: never fork a process that has loaded
deltalake (its runtime does not survive a fork).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RESULT = "RESULT "  # prefix of the light child's one result line
CHILD_TIMEOUT = 240


def child_env(warehouse: str, *, dagster_home: str | None = None, mv_config: str | None = None,
              kill_at: str | None = None, master: str = "local[2]",
              extra: dict | None = None) -> dict:
    """A child's environment; ``extra`` adds settings (an object store's, a Spark conf)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    env.update({"BACKFILL_WAREHOUSE": warehouse, "BACKFILL_SPARK_MASTER": master,
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": ROOT})
    if dagster_home:
        env["DAGSTER_HOME"] = dagster_home
    if mv_config:
        env["BACKFILL_MV_CONFIG"] = mv_config
    if kill_at:
        env["BACKFILL_TEST_KILL_AT"] = kill_at
    env.update(extra or {})
    return env


def init_dagster_home(path: str) -> str:
    """Create the Dagster instance's storage once (two runs starting on a fresh folder at
    the same moment would both migrate its SQLite schema)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    os.makedirs(path, exist_ok=True)
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(path)) as instance:
        instance.get_runs_count()
    return path


def write_mv_config(path: str, raw: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f)
    return path


@dataclass
class ChildResult:
    returncode: int
    output: str
    seconds: float

    @property
    def killed(self) -> bool:
        return self.returncode == -9

    @property
    def result(self) -> dict | None:
        lines = [ln for ln in self.output.splitlines() if ln.startswith(RESULT)]
        return json.loads(lines[-1][len(RESULT):]) if lines else None

    @property
    def error(self) -> str | None:
        res = self.result
        return res.get("error") if res else None


def dagster_backfill(warehouse: str, dagster_home: str, raw: dict, version: int,
                     vnodes: Sequence[int], *, kill_at: str | None = None,
                     master: str = "local[2]", extra_env: dict | None = None) -> ChildResult:
    """`dagster job execute -j backfill_job` for one barrier over the vnode range."""
    from backfill_assets.wiring.partitions import range_tags

    folder = os.path.join(dagster_home, "configs")
    os.makedirs(folder, exist_ok=True)
    mv_config = write_mv_config(os.path.join(folder, f"{raw['name']}.yaml"), raw)
    run_config = os.path.join(folder, f"run-{raw['name']}-{version}.yaml")
    with open(run_config, "w", encoding="utf-8") as f:
        yaml.safe_dump({"ops": {"vnode_backfill": {"config": {"barrier_version": version}}}}, f)
    tags = range_tags(min(vnodes), max(vnodes), raw["vnode_count"])
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "backfill_assets.definitions",
           "-j", "backfill_job", "-c", run_config, "--tags", json.dumps(tags)]
    env = child_env(warehouse, dagster_home=dagster_home, mv_config=mv_config, kill_at=kill_at,
                    master=master, extra=extra_env)
    return _run(cmd, env)


def light_args(warehouse: str, raw: dict, version: int | None, vnodes: Sequence[int], *,
               kill_at: str | None = None, rendezvous: dict | None = None,
               chunk_size: int | None = None, rate_limit: int | None = None,
               storage_options: dict | None = None) -> dict:
    return {"warehouse": warehouse, "mv": raw, "version": version, "vnodes": list(vnodes),
            "kill_at": kill_at, "rendezvous": rendezvous, "chunk_size": chunk_size,
            "rate_limit": rate_limit, "storage_options": storage_options}


def light_command(args: dict) -> list[str]:
    return [sys.executable, "-m", "tests.reliability.children", json.dumps(args)]


def light_backfill(args: dict, master: str = "local[2]",
                   extra_env: dict | None = None) -> ChildResult:
    return _run(light_command(args), child_env(args["warehouse"], master=master,
                                               extra=extra_env))


def start_light(args: dict, master: str = "local[1]") -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen(light_command(args), cwd=ROOT,
                            env=child_env(args["warehouse"], master=master),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, time.monotonic()


def finish(started: tuple[subprocess.Popen, float]) -> ChildResult:
    proc, t0 = started
    out, _ = proc.communicate(timeout=CHILD_TIMEOUT)
    return ChildResult(proc.returncode, out, time.monotonic() - t0)


def _run(cmd: list[str], env: dict) -> ChildResult:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT)
    return ChildResult(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


def rendezvous_hook(spec: dict | None) -> Callable[[str], None]:
    """Hold this run at `spec['point']` until every peer reached it (files in spec['dir'])."""
    if not spec:
        return lambda point: None

    def hook(point: str) -> None:
        if point != spec["point"]:
            return
        os.makedirs(spec["dir"], exist_ok=True)
        open(os.path.join(spec["dir"], f"ready-{spec['me']}"), "w").close()
        deadline = time.monotonic() + spec.get("timeout", 120)
        while time.monotonic() < deadline:
            if all(os.path.exists(os.path.join(spec["dir"], f"ready-{p}"))
                   for p in spec["peers"]):
                return
            time.sleep(0.05)
        raise TimeoutError(f"rendezvous at {point}: peers {spec['peers']} never arrived")

    return hook


def _child_main(args: dict) -> int:
    """The light child: one barrier with the kill hook (and a rendezvous); prints RESULT."""
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.controls import Controls
    from backfill_assets.testing.kill_hook import kill_hook
    from resources.settings import load_settings
    from resources.spark import LazySession, get_spark, spark_conf
    from tests.reliability.harness import definition, tables_of

    settings = load_settings()
    spark = LazySession(lambda: get_spark(settings), spark_conf(settings))  # as the op's
    raw = args["mv"]
    d, tables = definition(raw), tables_of(args["warehouse"], raw, args.get("storage_options"))
    kill, meet = kill_hook(args.get("kill_at")), rendezvous_hook(args.get("rendezvous"))

    def hook(point: str) -> None:
        meet(point)
        kill(point)

    try:
        report = run_barrier(spark, d, tables, args["vnodes"], version=args.get("version"),
                             overrides=Controls(args.get("chunk_size"), args.get("rate_limit")),
                             hook=hook)
    except Exception as exc:  # noqa: BLE001 - reported to the parent by name
        print(RESULT + json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 3
    print(RESULT + json.dumps({"error": None, "v_new": report.v_new,
                               "snapshot_rows": report.snapshot_rows,
                               "forwarded_rows": report.forwarded_rows,
                               "finished": report.finished,
                               "engine": report.engine,
                               "spark_started": spark.started}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(_child_main(json.loads(sys.argv[1])))
