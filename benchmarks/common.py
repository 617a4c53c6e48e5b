"""Shared pieces of the benchmarks: data, the change stream, baselines, profiling, memory.

Nothing here starts Spark at import time. The benchmark drivers (bench_*.py) run every Spark
workload in a fresh worker process under ``flock $BENCH_LOCK`` (default /tmp/spark.lock), so
that no other Spark job on the machine runs while a figure is taken and so that peak-memory
figures start from zero.

Environment:
  BENCH_DATA     cache of generated upstream tables (default /tmp/bench_data)
  BENCH_WORK     scratch folder for per-run copies and outputs (default /tmp/bench_work)
  BENCH_LOCK     the lock file shared by every Spark workload (default /tmp/spark.lock)
  BENCH_RESULTS  where results/<name>.json go (default benchmarks/results)
  BENCH_WORKER_TIMEOUT  seconds before a worker process is killed (default 2400)
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "benchmarks", "results"))
DATA_DIR = os.environ.get("BENCH_DATA", "/tmp/bench_data")
WORK_DIR = os.environ.get("BENCH_WORK", "/tmp/bench_work")
LOCK = os.environ.get("BENCH_LOCK", "/tmp/spark.lock")

# 8 upstream columns (+ the vnode partition column): the load generator's columns minus score.
BENCH_COLUMNS = {
    "region": "string", "id": "bigint", "name": "string", "amount": "decimal(12,2)",
    "qty": "int", "ts": "timestamp", "day": "date", "flag": "boolean",
}
PK_SHAPES = {"single": ("id",), "composite": ("region", "id")}
REGIONS = ("eu", "us", "apac", "latam", "mea")
DML_MIX = {"insert": 0.4, "update": 0.35, "delete": 0.15, "pk_change": 0.1}


# --------------------------------------------------------------------------- machine, output


def machine_info() -> dict:
    """What the figures were taken on."""
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="utf-8") as f:
        mem_kb = int(next(x for x in f if x.startswith("MemTotal")).split()[1])
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    versions = {}
    for mod in ("pyspark", "deltalake", "pyarrow", "dagster"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - informative only
            versions[mod] = "?"
    return {
        "nproc": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1), "cpu": cpu,
        "kernel": platform.release(), "python": platform.python_version(),
        "java": java.splitlines()[0] if java else "?", **versions,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "code": code_version(),
    }


def code_version() -> dict:
    """Which production code the figures are for: the git commit (and whether the working
    tree differs from it) or, in a frozen copy made by benchmarks/freeze.sh, its BENCH_SOURCE
    file; plus a hash of the production sources, so figures of different code never mix."""
    import hashlib

    digest = hashlib.sha1()
    for folder in ("backfill_assets", "resources", "jobs"):
        for base, _, files in sorted(os.walk(os.path.join(ROOT, folder))):
            for name in sorted(files):
                if name.endswith((".py", ".yaml")):
                    with open(os.path.join(base, name), "rb") as f:
                        digest.update(name.encode() + f.read())
    out = {"source_sha1": digest.hexdigest()[:12]}
    marker = os.path.join(ROOT, "BENCH_SOURCE")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            out["commit"] = f.read().strip()
        return out
    git = ["git", "-C", ROOT]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "backfill_assets", "resources", "jobs"],
                           capture_output=True, text=True)
    out["commit"] = head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip()
                                           else "")
    return out


def save_results(name: str, payload: dict) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=str)
    return path


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    rows = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print(" | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def human_rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


NOISE = ("WARN ", "log4j", "incubator modules", "setLogLevel", "log level", "\tat ",
         "\t... ")


def run_worker(module: str, args: Sequence[str], *, lock: bool = True,
               timeout: float | None = None) -> dict:
    """Run `python -m module args...` in a fresh process (under the Spark lock); the worker
    prints one JSON line prefixed `RESULT ` which is returned. A Java OutOfMemoryError (after
    which Spark jobs can hang forever) or the timeout kills the worker's process group."""
    import signal
    import threading

    cmd = [sys.executable, "-m", module, *args]
    if lock:
        cmd = ["flock", LOCK, *cmd]
    timeout = timeout or float(os.environ.get("BENCH_WORKER_TIMEOUT", "2400"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    result, why = None, None

    def kill(reason: str) -> None:
        nonlocal why
        why = why or reason
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill, args=(f"timeout after {timeout:.0f}s",))
    timer.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
                sys.stdout.write("    " + line)  # kept in the log, even if measured again
            elif "java.lang.OutOfMemoryError" in line:
                sys.stdout.write("    " + line)
                threading.Timer(10, kill, args=("Spark JVM OutOfMemoryError",)).start()
            elif not any(n in line for n in NOISE):
                sys.stdout.write("    " + line)
                sys.stdout.flush()
        code = proc.wait()
    finally:
        timer.cancel()
    if why or code != 0 or result is None:
        raise RuntimeError(why or f"exit {code}")
    return result


def run_clean(module: str, args: Sequence[str], *, threshold: float = 0.10,
              retry_below_s: float = 400) -> dict:
    """run_worker, once more when processes outside the benchmark used more than `threshold`
    of the machine's CPU during the measurement (short workers only); the result says how
    clean it was (`foreign_cpu_share`) and how many attempts it took."""
    result = run_worker(module, args)
    share = result.get("foreign_cpu_share") or 0.0
    took = result.get("seconds") or 0.0
    if share > threshold and took < retry_below_s:
        print(f"    ({100 * share:.0f}% of the CPU went to other processes: measuring again)",
              flush=True)
        again = run_worker(module, args)
        again["attempts"] = 2
        again["first_attempt_foreign_cpu_share"] = share
        return again
    return result


class Previous:
    """Results of an earlier, interrupted invocation (benchmarks/results/<name>.json) that were
    taken on the same production code: a rerun reuses them instead of measuring again
    (`--fresh` ignores them)."""

    def __init__(self, name: str, fresh: bool = False) -> None:
        self.sha = code_version()["source_sha1"]
        self.data: dict = {}
        path = os.path.join(RESULTS_DIR, f"{name}.json")
        if not fresh and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

    def find(self, section: str, **match) -> dict | None:
        for item in self.data.get(section, []):
            if (all(item.get(k) == v for k, v in match.items()) and "failed" not in item
                    and (item.get("code") or {}).get("source_sha1") == self.sha):
                print(f"    (reusing {section} {match} from an earlier run on the same code)",
                      flush=True)
                return item
        return None


def emit(result: dict) -> None:
    result.setdefault("code", code_version())
    print("RESULT " + json.dumps(result, default=str), flush=True)


def dispatch(args, workers: dict[str, Callable[..., dict]], run: Callable) -> None:
    """A benchmark's entry point: the worker subcommand ``args.cmd`` names (run in a fresh
    process by the driver; its result printed as a RESULT line), else the driver itself."""
    worker = workers.get(args.cmd)
    if worker is None:
        run(args)
    else:
        emit(worker(args))


# --------------------------------------------------------------------------- data


def bench_spec(pk: str, vnode_count: int, name: str = "bench_upstream"):
    from backfill_assets.upstream.writer import UpstreamSpec

    return UpstreamSpec(name=name, columns=dict(BENCH_COLUMNS), primary_key=PK_SHAPES[pk],
                        vnode_count=vnode_count, description="benchmark upstream")


def bench_mv(pk: str, mode: str, vnode_count: int, chunk_size: int, upstream: str,
             name: str | None = None):
    """jobs/configs/mv.yaml's MV (filter + computed columns) over the benchmark upstream."""
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict({
        "name": name or f"bench_{mode}", "upstream": upstream, "primary_key": list(PK_SHAPES[pk]),
        "columns": ["id", "region", "name", "amount", "qty", "ts"],
        "filter": "qty > 0 AND NOT flag",
        "computed": [{"name": "total", "expr": "amount * qty"},
                     {"name": "name_upper", "expr": "upper(name)"}],
        "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count,
    })


def upstream_path(rows: int, pk: str, vnode_count: int) -> str:
    return os.path.join(DATA_DIR, f"up_{human_rows(rows)}_{pk}_{vnode_count}v")


def prepare_upstream(rows: int, pk: str, vnode_count: int, seed: int = 0,
                     batch: int = 2_000_000, log: Callable[[str], None] = print) -> dict:
    """Create (once; cached under BENCH_DATA) an upstream of `rows` rows, ids 0..rows-1."""
    from backfill_assets.upstream.writer import create_upstream, insert_rows
    from backfill_assets.upstream.writer.load_generator import initial_rows_table

    path = upstream_path(rows, pk, vnode_count)
    marker = os.path.join(path, "_bench_ready.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(DATA_DIR, exist_ok=True)
    spec = bench_spec(pk, vnode_count)
    t0 = time.monotonic()
    create_upstream(path, spec)
    version = 0
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        data = initial_rows_table(seed, start, n).select(list(BENCH_COLUMNS))
        version = insert_rows(path, data, spec=spec, check_existing=False)
        log(f"  upstream {human_rows(rows)} {pk}: {start + n:,}/{rows:,} rows")
    info = {"path": path, "rows": rows, "pk": pk, "vnodes": vnode_count, "version": version,
            "seconds": round(time.monotonic() - t0, 1), "bytes": dir_bytes(path),
            "files": sum(1 for _ in _parquet_files(path))}
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return info


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in _walk_files(path))


def _walk_files(path: str):
    for folder, _, files in os.walk(path):
        for name in files:
            yield os.path.join(folder, name)


def _parquet_files(path: str):
    return (p for p in _walk_files(path) if p.endswith(".parquet"))


def work_copy(src: str, dst: str) -> str:
    """A private copy of a cached table: data files hard-linked (Delta never rewrites a data
    file in place), the log copied (so later commits never touch the cache)."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.dirname(dst), exist_ok=True)

    def link(s: str, d: str) -> None:
        if "_delta_log" in s.split(os.sep) or not s.endswith(".parquet"):
            shutil.copy2(s, d)
        else:
            os.link(s, d)

    shutil.copytree(src, dst, copy_function=link)
    return dst


# --------------------------------------------------------------------------- change stream


class ChangeMaker:
    """Valid DML batches against a benchmark upstream whose initial ids are 0..n-1 (tracks
    deleted ids only, so it needs no scan of the table and little memory)."""

    OPS = tuple(DML_MIX)

    def __init__(self, pk: str, next_id: int, seed: int = 1) -> None:
        self.composite = pk == "composite"
        self.next_id = next_id
        self.deleted: set[int] = set()
        self.rng = random.Random(seed)
        self.weights = [DML_MIX[o] for o in self.OPS]

    def key(self, id_: int) -> tuple:
        return (REGIONS[id_ % 5], id_) if self.composite else (id_,)

    def row(self, id_: int) -> dict:
        from backfill_assets.upstream.writer.load_generator import random_row

        r = random_row(self.rng, REGIONS[id_ % 5], id_)
        r.pop("score", None)
        return r

    def _pick(self, touched: set[int]) -> int:
        while True:
            id_ = self.rng.randrange(self.next_id)
            if id_ not in self.deleted and id_ not in touched:
                return id_

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def batch(self, size: int):
        from backfill_assets.upstream.writer import DmlBatch

        touched: set[int] = set()
        ins, upd, dels, pks = [], [], [], []
        for op in self.rng.choices(self.OPS, self.weights, k=size):
            if op == "insert":
                id_ = self.new_id()
                ins.append(self.row(id_))
            elif op == "update":
                id_ = self._pick(touched)
                full = self.row(id_)
                keep = [c for c in ("name", "amount", "qty", "flag") if self.rng.random() < 0.6]
                upd.append({c: full[c] for c in ("region", "id", *keep)})
            elif op == "delete":
                id_ = self._pick(touched)
                dels.append(self.key(id_))
                self.deleted.add(id_)
            else:
                id_ = self._pick(touched)
                new = self.new_id()
                pks.append((self.key(id_), self.row(new)))
                self.deleted.add(id_)
                touched.add(new)
            touched.add(id_)
        return DmlBatch(inserts=ins, updates=upd, deletes=dels, pk_changes=pks)


def _feeder_main(conn, uri: str, pk: str, vnode_count: int, next_id: int, seed: int) -> None:
    from backfill_assets.upstream.writer import apply_dml

    spec = bench_spec(pk, vnode_count)
    maker = ChangeMaker(pk, next_id, seed)
    while True:
        n = conn.recv()
        if n is None:
            break
        t0 = time.monotonic()
        version = apply_dml(uri, maker.batch(n), spec=spec)
        conn.send({"version": version, "seconds": time.monotonic() - t0, "changes": n})


class DmlFeeder:
    """The upstream's writer, in its own process (it is another engine in production, and
    its memory must not count as the backfill driver's): one DML batch = one Delta version."""

    def __init__(self, uri: str, pk: str, vnode_count: int, next_id: int, seed: int = 1):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_feeder_main, daemon=True,
                                args=(child, uri, pk, vnode_count, next_id, seed))
        self.proc.start()
        self.seconds = 0.0
        self.batches = 0

    def apply(self, changes: int) -> dict:
        self.conn.send(changes)
        out = self.conn.recv()
        self.seconds += out["seconds"]
        self.batches += 1
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(30)


# --------------------------------------------------------------------------- memory and CPU


def proc_status(pid: int | str, key: str) -> int | None:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM), in bytes."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="utf-8") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def java_pid(parent: int | None = None) -> int | None:
    """The Spark JVM: the java descendant of this (driver) process."""
    for p in descendants(parent or os.getpid()):
        if _comm(p) == "java":
            return p
    return None


def cpu_seconds(pid: int | None) -> float:
    """user+system CPU of a process (all threads)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class Memory:
    """Peak RSS of the driver (VmHWM, kernel-tracked) and of the Spark JVM, plus a sampler
    for the Spark Python workers (children of the JVM, if any ever start)."""

    def __init__(self) -> None:
        self.jvm: int | None = None
        self.samples: list[dict] = []

    def attach(self) -> None:
        self.jvm = java_pid()

    def snapshot(self, label: str) -> dict:
        s = {"label": label,
             "driver_rss": proc_status("self", "VmRSS"), "driver_hwm": proc_status("self", "VmHWM"),
             "jvm_rss": proc_status(self.jvm, "VmRSS") if self.jvm else None,
             "jvm_hwm": proc_status(self.jvm, "VmHWM") if self.jvm else None}
        self.samples.append(s)
        return s

    def peaks(self) -> dict:
        s = self.snapshot("end")
        workers = [p for p in descendants(self.jvm)] if self.jvm else []
        return {"driver_peak": s["driver_hwm"], "jvm_peak": s["jvm_hwm"],
                "spark_python_workers": len(workers)}


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores)."""
    with open("/proc/stat", encoding="utf-8") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> float:
    me = os.getpid()
    return cpu_seconds(me) + sum(cpu_seconds(p) for p in descendants(me))


class CpuAudit:
    """How much CPU processes outside this benchmark's process tree used while it measured:
    figures taken while something else ran are flagged (foreign share of all cores)."""

    def __init__(self) -> None:
        self.busy0, self.mine0, self.t0 = _busy_seconds(), _tree_cpu(), time.monotonic()

    def result(self) -> dict:
        wall = time.monotonic() - self.t0
        foreign = max(0.0, (_busy_seconds() - self.busy0) - (_tree_cpu() - self.mine0))
        return {"foreign_cpu_s": round(foreign, 1),
                "foreign_cpu_share": round(foreign / max(wall * (os.cpu_count() or 1), 1e-9), 3)}


def mib(b: int | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)


# --------------------------------------------------------------------------- phase profile


@dataclass
class _Frame:
    name: str
    t0: float
    py0: float
    jvm0: float
    child: list = field(default_factory=lambda: [0.0, 0.0, 0.0])


class PhaseProfiler:
    """Wall time, driver-process CPU (Python + delta-rs + pyarrow) and Spark-JVM CPU of each
    phase of a barrier, by wrapping the step's functions (exclusive times: a phase's own time
    without the phases nested in it). Installed once per benchmark process."""

    def __init__(self) -> None:
        self.jvm: int | None = None
        self.stack: list[_Frame] = []
        self.current: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}

    def reset(self) -> dict[str, list[float]]:
        out, self.current = self.current, {}
        return out

    @contextmanager
    def phase(self, name: str):
        f = _Frame(name, time.perf_counter(), time.process_time(), cpu_seconds(self.jvm))
        self.stack.append(f)
        try:
            yield
        finally:
            self.stack.pop()
            incl = [time.perf_counter() - f.t0, time.process_time() - f.py0,
                    cpu_seconds(self.jvm) - f.jvm0]
            excl = [a - b for a, b in zip(incl, f.child, strict=True)]
            acc = self.current.setdefault(name, [0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += excl[i]
            if self.stack:
                for i in range(3):
                    self.stack[-1].child[i] += incl[i]

    def wrap(self, owner, attr: str, name: str | Callable[..., str]) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:  # the step was refactored: profile what still exists
            print(f"  (profiler: {getattr(owner, '__name__', owner)}.{attr} not found)")
            return
        prof = self

        def wrapper(*args, **kwargs):
            label = name(*args, **kwargs) if callable(name) else name
            with prof.phase(label):
                return fn(*args, **kwargs)

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        setattr(owner, attr, wrapper)

    def install(self) -> PhaseProfiler:

        from backfill_assets import storage
        from backfill_assets.arrow import netting as arrow_changes
        from backfill_assets.mv import tables as mv_store
        from backfill_assets.step import barrier
        from backfill_assets.step import bulk_read as snapshot_read
        from backfill_assets.step import chunk as chunk_reads
        from backfill_assets.step import forward as step_changes
        from backfill_assets.step import loop as step
        from backfill_assets.step.modes import arrangement
        from backfill_assets.step.modes import snapshot as snapshot_mode
        from backfill_assets.storage.rows import keyed
        from backfill_assets.storage.writes import maintain, merge

        self.wrap(barrier, "run_step", "step glue (other)")
        self.wrap(step, "checked_upstream", "check upstream + pin")
        self.wrap(step, "validate_expressions", "validate MV (Spark analyze)")
        self.wrap(mv_store, "ensure_table", "open tables (delta-rs log)")
        self.wrap(mv_store, "open_table", "open tables (delta-rs log)")
        self.wrap(mv_store, "txn_versions", "app-txn lookups")
        self.wrap(step, "recover_state", "recover progress")
        self.wrap(step, "change_rows", "change read (storage layer, Arrow)")
        self.wrap(step, "in_spark", "changes into Spark")
        self.wrap(arrow_changes, "net_with_prior", "keyed: netting (Arrow)")
        self.wrap(arrow_changes, "visible", "keyed: visible rows (Arrow + core order)")
        self.wrap(step_changes, "project_rows", "keyed: projection (Spark, local)")
        self.wrap(step, "check_inserted_keys_local", "keyed: inserted-key check")
        self.wrap(keyed, "_positions", "keyed: key lookups (key columns)")
        self.wrap(keyed, "write_table", "keyed: data + change files (driver)")
        self.wrap(arrangement.ReplicaSource, "_initialise", "replica init (Spark read + write)")
        self.wrap(merge, "write_files", "data + change files (Spark mapInArrow)")
        self.wrap(merge, "commit", "Delta commit (log entry, DVs)")
        self.wrap(merge, "_match", "merge-on-read: changed keys meet held rows")
        self.wrap(merge, "_deleted_rows", "merge-on-read: positions to the driver")
        self.wrap(maintain, "compact", "compaction")
        self.wrap(arrangement.ReplicaSource, "_replicate", "replica merge (merge-on-read)")
        self.wrap(step, "forwarded", "forward netting (Spark)")
        self.wrap(step, "forwarded_keyed", "keyed forward (glue)")
        self.wrap(step, "snapshot_chunk", "snapshot chunk: seek plan (log stats) + glue")
        self.wrap(chunk_reads, "first_rows", "no_shuffle cut: top-k of the candidates (Spark)")
        self.wrap(chunk_reads, "chunk_stats",
                  "chunk: read picked files + in-task sort + stats + pk flags (Spark)")
        self.wrap(chunk_reads, "check_snapshot_keys",
                  "pk check: fresh vnodes' snapshot (Spark groupBy)")
        self.wrap(step, "write_progress", "progress commit (delta-rs)")
        self.wrap(storage, "vnode_key_stats", "bulk: per-vnode key stats (read tasks, keys only)")
        self.wrap(storage, "shared_cut", "no_shuffle cut: key columns (driver threads)")
        self.wrap(storage, "write_chunk", "chunk tasks: read + project + write (Spark, Arrow)")
        self.wrap(snapshot_read, "_vnode_stats", "bulk: per-vnode key stats (Spark aggregate)")
        self.wrap(snapshot_read, "check_snapshot_keys", "bulk: pk check (Spark groupBy)")
        self.wrap(snapshot_mode, "estimate_rows", "bulk: slice plan (log stats)")
        self.wrap(snapshot_mode, "history_safety", "bulk: history safety (upstream log)")
        self.wrap(step_changes, "check_change_keys", "pk check: change chunk (pyarrow)")
        self.wrap(mv_store, "replace_keyed", "progress commit: storage layer")
        if hasattr(step, "_Step"):
            self.wrap(step._Step, "open", "step open: plan + misc")
            self.wrap(step._Step, "_commit_mv", "MV write (merge-on-read / append)")
            self.wrap(step._Step, "_check_inserted", "inserted-key check (glue)")
        return self


def add_phases(total: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for k, v in more.items():
        acc = total.setdefault(k, [0.0, 0.0, 0.0])
        for i in range(3):
            acc[i] += v[i]


def rounded_phases(phases: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [round(x, 3) for x in v]
            for k, v in sorted(phases.items(), key=lambda kv: -kv[1][0])}


# --------------------------------------------------------------------------- Spark + baselines


def start_spark():
    """The platform's own session (resources.spark.get_spark), warmed up so the first
    measured job does not pay class loading / JIT."""
    from resources.spark import get_spark

    t0 = time.monotonic()
    spark = get_spark()
    spark.range(200_000).selectExpr("id", "id % 7 AS k").groupBy("k").count().collect()
    return spark, time.monotonic() - t0


def warm_read(spark, uri: str, warm_rows: int = 500_000) -> None:
    """Warm the JVM on ~warm_rows rows of the table (parquet read and write, a window sort,
    Arrow collection), twice, so that no measured phase pays class loading / JIT alone: every
    worker, baseline or backfill, runs this once before its first measurement."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from backfill_assets.engine import netting as spark_ops
    from backfill_assets.storage.delta import delta_rs as delta_store

    table = delta_store.open_table(uri)
    schema = delta_store.arrow_schema(table)
    records = table.get_add_actions(flatten=True).column("num_records").to_pylist()
    rows = sum(n or 0 for n in records)
    count = int(table.metadata().configuration.get("backfill.vnodeCount", "256"))
    warm = list(range(max(1, min(count, count * warm_rows // max(rows, 1)))))
    out = os.path.join(WORK_DIR, f"warm_{os.getpid()}")
    for _ in range(2):
        df = spark_ops.read_version(spark, uri, table.version(), schema, vnodes=warm)
        df.write.mode("overwrite").parquet(out)
        w = Window.partitionBy("vnode").orderBy("id")
        df.withColumn("_rn", F.row_number().over(w)).where("_rn <= 1000").toArrow()
    shutil.rmtree(out, ignore_errors=True)


def summary(values: Sequence[float]) -> dict:
    values = sorted(values)
    if not values:
        return {"n": 0}
    p95 = values[min(len(values) - 1, max(0, round(0.95 * len(values) + 0.5) - 1))]
    return {"n": len(values), "median": statistics.median(values), "p95": p95,
            "min": values[0], "max": values[-1], "mean": statistics.fmean(values)}
