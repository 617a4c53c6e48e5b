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
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from benchmarks.bench_data import (
    BENCH_COLUMNS,
    DATA_DIR,
    PK_SHAPES,
    DmlFeeder,
    bench_mv,
    bench_spec,
    change_generator,
    dir_bytes,
    human_rows,
    prepare_upstream,
    upstream_path,
    work_copy,
)
from benchmarks.measure import (
    CpuAudit,
    Memory,
    PhaseProfiler,
    add_phases,
    cpu_seconds,
    descendants,
    java_pid,
    mib,
    proc_status,
    rounded_phases,
)

# the benchmarks reach the data (bench_data.py) and the measurements (measure.py) through this
# one module too
__all__ = ["BENCH_COLUMNS", "DATA_DIR", "LOCK", "PK_SHAPES", "RESULTS_DIR",
           "ROOT", "WORK_DIR", "CpuAudit", "DmlFeeder", "Memory", "PhaseProfiler",
           "Previous", "add_phases", "bench_mv", "bench_spec", "change_generator", "code_version",
           "cpu_seconds",
           "descendants", "dir_bytes", "dispatch", "emit", "human_rows", "java_pid",
           "lock_held_above",
           "machine_info", "mib", "prepare_upstream", "print_table", "proc_status",
           "rounded_phases", "run_clean", "run_worker", "save_results", "start_spark",
           "summary", "upstream_path", "warm_read", "work_copy"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "benchmarks", "results"))
WORK_DIR = os.environ.get("BENCH_WORK", "/tmp/bench_work")
LOCK = os.environ.get("BENCH_LOCK", "/tmp/spark.lock")



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
        "code": code_version(), "cpu_gauge": cpu_gauge(),
    }


def cpu_gauge() -> float:
    """Seconds a fixed pure-Python loop takes (best of 3): the machine's speed at that
    moment. The same code's barriers measured up to twice as long on some hours as on others
    (a shared host), so every result carries this figure, taken when its worker ends, to
    tell a slower machine from slower code."""
    import time

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        sum(range(5_000_000))
        best = min(best, time.perf_counter() - t)
    return round(best, 4)


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


NOISE = ("WARN ", "log4j", "incubator modules", "setLogLevel", "log level", "\tat ",
         "\t... ")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def lock_held_above(lock: str = LOCK) -> bool:
    """Whether an ancestor of this process is `flock <lock> ...` (it holds the lock for us: a
    worker's own flock on the same file would wait for its parent forever)."""
    target = os.path.realpath(lock)
    pid = os.getppid()
    while pid > 1:
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) == "flock" and any(
                os.path.realpath(a) == target for a in argv[1:3]):
            return True
        pid = _parent(pid)
    return False


def run_worker(module: str, args: Sequence[str], *, lock: bool = True,
               timeout: float | None = None) -> dict:
    """Run `python -m module args...` in a fresh process (under the Spark lock, unless the
    driver already holds it: `flock /tmp/spark.lock python -m benchmarks.X`); the worker
    prints one JSON line prefixed `RESULT ` which is returned. A Java OutOfMemoryError (after
    which Spark jobs can hang forever) or the timeout kills the worker's process group."""
    import signal
    import threading

    cmd = [sys.executable, "-m", module, *args]
    if lock and not lock_held_above():
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
    result.setdefault("cpu_gauge", cpu_gauge())
    print("RESULT " + json.dumps(result, default=str), flush=True)


def dispatch(args, workers: dict[str, Callable[..., dict]], run: Callable) -> None:
    """A benchmark's entry point: the worker subcommand ``args.cmd`` names (run in a fresh
    process by the driver; its result printed as a RESULT line), else the driver itself."""
    worker = workers.get(args.cmd)
    if worker is None:
        run(args)
    else:
        emit(worker(args))


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

    from backfill_assets import storage

    table = storage.open_table(uri)
    schema = storage.arrow_schema(table)
    records = table.get_add_actions(flatten=True).column("num_records").to_pylist()
    rows = sum(n or 0 for n in records)
    count = int(table.metadata().configuration.get("backfill.vnodeCount", "256"))
    warm = list(range(max(1, min(count, count * warm_rows // max(rows, 1)))))
    out = os.path.join(WORK_DIR, f"warm_{os.getpid()}")
    for _ in range(2):
        df = storage.read_version(spark, uri, table.version(), schema, vnodes=warm)
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
