"""The driver's heap in a process that runs step after step (the follower, a long run).

Why: CPython's cyclic collector scans every tracked object in a full collection. After a first
step the driver holds a couple of hundred thousand of them that live as long as the process
(Spark's py4j objects, Dagster's, the parsed Delta logs in the caches), so each full
collection costs a sizeable share of a small barrier, and a small barrier meets one every few
runs: its time then varies by that much. Moving what exists after
the first step out of the collector's reach (`gc.freeze`, after one full collection so no
garbage is frozen) leaves it only the objects made since. Reference counting still frees
everything frozen that is dropped later (an evicted cache entry); only a cycle among frozen
objects would outlive its use, and the collection before the freeze leaves none behind.

A process that runs one step (a Dagster run per barrier) never pays for it: it happens when
the second step starts.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_steps_started = 0


def step_starting() -> None:
    """Call as a step starts; the process's second step settles the heap first (once)."""
    global _steps_started
    with _lock:
        _steps_started += 1
        if _steps_started != 2:
            return
        gc.collect()
        gc.freeze()
