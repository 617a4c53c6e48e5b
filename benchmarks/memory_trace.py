"""Where the driver's memory peaks: RSS sampled beside the phase profiler.

VmHWM says how high the driver went, not in which phase. A sampler thread reads VmRSS every
few milliseconds and charges it to the innermost phase the profiler has open at that moment,
and keeps the main thread's Python stack (the platform's frames) at the highest sample: a
benchmark's memory target then names the phase and the code that bound it.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

import pyarrow as pa

from benchmarks.common import PhaseProfiler, mib, proc_status

_OWN = ("backfill_assets", "benchmarks")


def reset_peak() -> None:
    """Start the driver's VmHWM again from its current RSS (Linux ``clear_refs`` 5): the
    benchmark's own set-up (the Spark session, the warm-up read, which collects 500K rows
    at every size) then leaves what it holds in the figure, but not its transient peak."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


class RssTrace:
    """Peak RSS per phase (innermost open phase of ``prof``), and the stack at the peak."""

    def __init__(self, prof: PhaseProfiler, every: float = 0.005) -> None:
        self.prof, self.every = prof, every
        self.by_phase: dict[str, float] = {}
        self.peak = 0
        self.peak_at: dict = {}
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-trace", daemon=True)

    def start(self) -> RssTrace:
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return self.result()

    def result(self) -> dict:
        return {"peak_mib": mib(self.peak), "peak_at": self.peak_at,
                "by_phase_mib": {k: mib(v) for k, v in
                                 sorted(self.by_phase.items(), key=lambda kv: -kv[1])}}

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = proc_status("self", "VmRSS") or 0
            stack = list(self.prof.stack)
            phase = stack[-1].name if stack else "(outside phases)"
            if rss > self.by_phase.get(phase, 0):
                self.by_phase[phase] = rss
            if rss > self.peak:
                self.peak = rss
                self.peak_at = {"phases": [f.name for f in stack],
                                "arrow_allocated_mib": mib(pa.total_allocated_bytes()),
                                "at": round(time.monotonic(), 2), "stack": self._own_stack()}

    def _own_stack(self) -> list[str]:
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return []
        lines = [f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} "
                 f"{f.name}" for f in traceback.extract_stack(frame)
                 if any(part in f.filename for part in _OWN)]
        return lines[-8:]
