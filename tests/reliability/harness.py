"""Fault-injection harness: real backfills in child processes, killed at commit boundaries.

What it gives the reliability tests:

- `Chain`: one MV over a pre-written upstream (seeded DML, one Delta version per batch) with a
  pinned barrier script, so two chains over the same upstream see exactly the same barriers and
  must end with exactly the same tables. The reference chain runs in-process; the crash chain
  runs the barrier under test in a child process that SIGKILLs itself at a kill point.
- children: `dagster job execute ... -j backfill_job` (the real wiring: definitions from the
  environment, `BACKFILL_TEST_KILL_AT`, run config `barrier_version`, partition range tags) and
  a light child (`python -m tests.reliability.harness '<json>'`) that calls `run_barrier` with
  `faults.kill_hook` and, for the concurrency tests, a file rendezvous that holds both runs at
  a point until both reached it.
- `snapshot` / `assert_same_tables`: MV rows (multiset of all columns), progress rows, Delta
  versions, duplicate keys.
- `verify_recovered`: the invariant of DESIGN.md section 4 on the *recoverable* state (the
  progress table completed by the MV commit a crash left without its progress commit), plus the
  replica invariant (replicated_state of an unfinished vnode == upstream at its recorded version).
  Unlike `oracle.verify` it holds after *every* commit, also between the MV and progress commits.

Children are plain processes started with `subprocess`: never fork a process that has loaded
deltalake (its runtime does not survive a fork).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

VNODES = 8
RESULT = "RESULT "  # prefix of the light child's one result line
CHILD_TIMEOUT = 240


# ------------------------------------------------------------------------------ definitions


def mv_raw(name: str, mode: str, chunk_size: int, upstream: str, vnode_count: int = VNODES,
           **extra) -> dict:
    """The MV the suite uses (the e2e tests' MV: a filter, two computed columns)."""
    return {"name": name, "upstream": upstream, "primary_key": ["id"],
            "columns": ["id", "name", "amount", "qty"], "filter": "qty > 2",
            "computed": [{"name": "amount_x_qty", "expr": "amount * qty"},
                         {"name": "name_upper", "expr": "upper(name)"}],
            "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count, **extra}


def definition(raw: dict):
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict(raw)


def tables_of(warehouse: str, raw: dict, storage_options: dict | None = None):
    from backfill_assets.mv.tables import MVTables

    return MVTables.under(warehouse, raw["name"], raw["upstream"], storage_options)


def orders(warehouse: str, seed: int, vnode_count: int = VNODES, name: str = "orders",
           storage_options: dict | None = None):
    """A seeded LiveUpstream of the e2e tests' `orders` table (not created yet); the
    warehouse may be an object-store URI reached with ``storage_options``."""
    from tests.support import LiveUpstream, simple_row, simple_spec

    return LiveUpstream(f"{warehouse}/{name}", simple_spec(vnode_count, name),
                        random.Random(seed), simple_row, lambda rng: rng.randint(1, 100_000),
                        storage_options=storage_options)


def prewrite(live, rows: int, batches: int, changes: int) -> list[int]:
    """Create the upstream, load `rows`, then `batches` DML versions; the versions written."""
    live.create(rows)
    versions = [latest(live.uri, live.storage_options)]
    for _ in range(batches):
        versions.append(live.apply(live.random_batch(changes)))
    return versions


def latest(uri: str, storage_options: dict | None = None) -> int:
    from deltalake import DeltaTable

    return DeltaTable(uri, storage_options=storage_options or None).version()


# ---------------------------------------------------------------------------- table states


@dataclass(frozen=True)
class TableState:
    """What a crash test compares: MV rows, progress rows, and each table's Delta version."""

    mv: Counter
    progress: tuple
    versions: dict
    mv_duplicates: int

    @property
    def mv_rows(self) -> int:
        return sum(self.mv.values())


def _frozen(row: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def _open(uri: str, storage_options=None, version: int | None = None):
    from backfill_assets.mv.tables import open_table

    return open_table(uri, storage_options or {}, version)


def table_versions(tables) -> dict:
    out = {}
    for name in ("mv", "replica", "progress"):
        t = _open(getattr(tables, name), tables.storage_options)
        out[name] = None if t is None else t.version()
    return out


def snapshot(tables, key_names: Sequence[str] = ("id",)) -> TableState:
    from backfill_assets.mv.tables import read_rows

    mv = _open(tables.mv, tables.storage_options)
    rows = read_rows(mv).to_pylist() if mv is not None else []
    keys = Counter((r["vnode"], *(r[k] for k in key_names)) for r in rows)
    progress = _open(tables.progress, tables.storage_options)
    prows = read_rows(progress).to_pylist() if progress is not None else []
    return TableState(Counter(_frozen(r) for r in rows),
                      tuple(sorted(_frozen(r) for r in prows)),
                      table_versions(tables), sum(n - 1 for n in keys.values() if n > 1))


def assert_same_tables(expected: TableState, actual: TableState, what: str) -> int:
    """MV rows (as a multiset) and progress rows identical, no duplicate key; rows compared."""
    assert actual.mv_duplicates == 0, f"{what}: {actual.mv_duplicates} duplicate MV keys"
    missing = expected.mv - actual.mv
    extra = actual.mv - expected.mv
    assert not missing and not extra, (
        f"{what}: MV differs from the uninterrupted run: {sum(missing.values())} missing, "
        f"{sum(extra.values())} unexpected rows; e.g. missing {list(missing)[:2]}, "
        f"unexpected {list(extra)[:2]}")
    assert actual.progress == expected.progress, (
        f"{what}: progress differs from the uninterrupted run:\n"
        f"expected {_progress_text(expected.progress)}\nactual   {_progress_text(actual.progress)}")
    return expected.mv_rows + len(expected.progress)


def _progress_text(rows: tuple) -> str:
    return "; ".join(",".join(f"{k}={v}" for k, v in r if k != "vnode") for r in rows[:8])


# ------------------------------------------------------------------------- invariant check


@dataclass
class Check:
    """Result of `verify_recovered`."""

    rows_compared: int = 0
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def recovered_progress(d, tables, vnodes: Sequence[int]) -> dict:
    """vnode -> (progress, version) as the next step would recover it (NotStarted left out)."""
    from backfill_assets.core.progress import NotStarted
    from backfill_assets.mv.recovery import recover_state
    from backfill_assets.step.preflight import checked_upstream

    progress_table = _open(tables.progress, tables.storage_options)
    mv = _open(tables.mv, tables.storage_options)
    if progress_table is None or mv is None:
        return {}
    key_order = checked_upstream(tables, d, None).key_order
    state, _ = recover_state(d.name, key_order, vnodes, progress_table, mv)
    return {v: (state.committed(v), state.version(v)) for v in vnodes
            if not isinstance(state.committed(v), NotStarted)}


def verify_recovered(spark, d, tables, vnodes: Sequence[int] | None = None) -> Check:
    """DESIGN.md section 4 after any commit: MV[k] == f(upstream@v_k, key <= pos_k) with the
    recoverable progress, and replica[k] == upstream@r_k for unfinished arrangement vnodes."""
    from backfill_assets.core.progress import Completed
    from backfill_assets.core.vnode import vnode_of
    from backfill_assets.mv.tables import read_rows, txn_versions
    from backfill_assets.step.oracle import verify
    from backfill_assets.step.preflight import checked_upstream

    vnodes = list(range(d.vnode_count)) if vnodes is None else list(vnodes)
    upstream = checked_upstream(tables, d, None)
    progress = recovered_progress(d, tables, vnodes)
    check = Check()
    verdict = verify(spark, d, tables, vnodes, progress=progress)
    check.rows_compared += verdict.rows_compared
    check.failures += [("mv", v.vnode, v.missing, v.unexpected) for v in verdict.failures()]
    replica = _open(tables.replica, tables.storage_options)
    if d.mode != "arrangement" or replica is None:
        return check
    names = [f.name for f in upstream.schema]
    at = txn_versions(replica, d.name, "replica", vnodes)
    live = [v for v in vnodes if at[v] is not None
            and not isinstance(progress.get(v, (None,))[0], Completed)]
    rows = _resolved(read_rows(replica, live), upstream.key_order).to_pylist() if live else []
    got = defaultdict(Counter)
    for row in rows:
        got[row["vnode"]][_frozen({k: row[k] for k in names})] += 1
    for version in sorted({at[v] for v in live}):
        group = {v for v in live if at[v] == version}
        want = defaultdict(Counter)
        upstream_at = _open(tables.upstream, tables.storage_options, version)
        for row in read_rows(upstream_at, None, names).to_pylist():
            k = vnode_of((row["id"],), upstream.key_types, d.vnode_count)
            if k in group:
                want[k][_frozen(row)] += 1
        for vnode in sorted(group):
            check.rows_compared += sum(want[vnode].values())
            if want[vnode] != got[vnode]:
                check.failures.append(("replica", vnode, sum((want[vnode] - got[vnode]).values()),
                                       sum((got[vnode] - want[vnode]).values())))
    return check


def _resolved(rows, key_order):
    """The replica's rows as a reader sees them: newest version per key (storage/replica.py)."""
    from backfill_assets.storage.rows import replica

    return replica.resolve(rows, key_order).drop_columns([replica.VERSION, replica.DELETED])


def assert_recovered_invariant(spark, d, tables, what: str) -> int:
    check = verify_recovered(spark, d, tables)
    assert check.ok, f"{what}: invariant broken (table, vnode, missing, unexpected): " \
                     f"{check.failures[:8]}"
    return check.rows_compared


def assert_oracle(spark, d, tables, what: str) -> int:
    """The platform's own oracle (progress table only): what verify_job runs."""
    from backfill_assets.step.oracle import verify

    verdict = verify(spark, d, tables)
    bad = [(v.vnode, v.missing, v.unexpected) for v in verdict.failures()]
    assert not bad, f"{what}: oracle mismatch (vnode, missing, unexpected): {bad}"
    return verdict.rows_compared


def run_verify_job(d, warehouse: str) -> int:
    """verify_job through Dagster (execute_in_process; it shares this process's Spark)."""
    import dagster as dg

    from jobs.verify import build_verify_job
    from resources.settings import load_settings
    from resources.spark import spark_resource
    from resources.warehouse import warehouse_resource

    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse,
                              "BACKFILL_VNODE_COUNT": str(d.vnode_count)})
    job = build_verify_job(d, settings)
    result = job.execute_in_process(resources={"spark": spark_resource(settings),
                                               "warehouse": warehouse_resource(settings)},
                                    instance=dg.DagsterInstance.ephemeral(),
                                    raise_on_error=False)
    assert result.success, f"verify_job failed for {d.name}"
    return int(result.output_for_node("verify_mv"))


# ---------------------------------------------------------------------------------- chains


@dataclass
class Barrier:
    """One barrier of a script: a pinned upstream version over some vnodes."""

    version: int
    vnodes: tuple[int, ...] = tuple(range(VNODES))
    chunk_size: int | None = None
    rate_limit: int | None = None


@dataclass
class Chain:
    """One MV driven through a barrier script; remembers the state after every barrier."""

    spark: object
    warehouse: str
    raw: dict
    states: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    storage_options: dict | None = None  # an object-store warehouse's options

    @property
    def d(self):
        return definition(self.raw)

    @property
    def tables(self):
        return tables_of(self.warehouse, self.raw, self.storage_options)

    def run(self, b: Barrier, hook=None):
        from backfill_assets.mv.controls import Controls
        from backfill_assets.step.barrier import run_barrier

        report = run_barrier(self.spark, self.d, self.tables, list(b.vnodes), version=b.version,
                             overrides=Controls(b.chunk_size, b.rate_limit),
                             **({"hook": hook} if hook else {}))
        self.reports.append(report)
        self.states.append(snapshot(self.tables))
        return report


# -------------------------------------------------------------------------------- children


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
    return [sys.executable, "-m", "tests.reliability.harness", json.dumps(args)]


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
    from backfill_assets.mv.controls import Controls
    from backfill_assets.step.barrier import run_barrier
    from backfill_assets.step.faults import kill_hook
    from resources.settings import load_settings
    from resources.spark import LazySession, get_spark, spark_conf

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


def vnode_ranges(rng: random.Random, vnodes: Iterable[int], max_ranges: int = 4) -> list[list]:
    """A random split of `vnodes` into contiguous ranges (a rescale)."""
    ordered = sorted(vnodes)
    cuts = sorted(rng.sample(range(1, len(ordered)), k=rng.randint(0, min(max_ranges - 1,
                                                                        len(ordered) - 1))))
    bounds = [0, *cuts, len(ordered)]
    return [ordered[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(_child_main(json.loads(sys.argv[1])))
