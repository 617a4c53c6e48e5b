"""What a benchmark worker measures besides wall time: memory (RSS and peaks of the process
tree, the Spark JVM's), CPU (its own, and other processes' share of the machine during the
measurement) and a phase profile of a barrier. common.py re-exports these names."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

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
        from backfill_assets.arrow import netting
        from backfill_assets.mv import owned_tables
        from backfill_assets.step import bulk_read as snapshot_read
        from backfill_assets.step import chunk as chunk_reads
        from backfill_assets.step import forward as step_changes
        from backfill_assets.step import loop as step
        from backfill_assets.step import modes
        from backfill_assets.step.modes import arrangement
        from backfill_assets.step.modes import snapshot as snapshot_mode
        from backfill_assets.storage.rows import keyed
        from backfill_assets.storage.writes import maintain, merge

        self.wrap(modes, "run_step", "step glue (other)")
        self.wrap(step, "checked_upstream", "check upstream + pin")
        self.wrap(step, "validate_expressions", "validate MV (Spark analyze)")
        self.wrap(owned_tables, "ensure_table", "open tables (delta-rs log)")
        self.wrap(owned_tables, "open_if_exists", "open tables (delta-rs log)")
        self.wrap(owned_tables, "txn_versions", "app-txn lookups")
        self.wrap(step, "recover_state", "recover progress")
        self.wrap(step, "change_rows", "change read (storage layer, Arrow)")
        self.wrap(step, "in_spark", "changes into Spark")
        self.wrap(netting, "net_with_prior", "keyed: netting (Arrow)")
        self.wrap(netting, "visible", "keyed: visible rows (Arrow + core order)")
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
        self.wrap(owned_tables, "replace_keyed", "progress commit: storage layer")
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


