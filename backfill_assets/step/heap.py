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

When: as a first step that ran long (a bulk) ends, where the collection is a small share of
it and the first small barrier after it does not carry it; otherwise as the second step
starts, so a process that runs one short step (a Dagster run per barrier) never pays for it.
"""

from __future__ import annotations

import gc
import threading

LONG_STEP_SECONDS = 5.0  # a first step this long settles the heap as it ends

_lock = threading.Lock()
_steps_started = 0
_settled = False


def step_starting() -> None:
    """Call as a step starts; the process's second step settles the heap first, unless the
    first one did as it ended (once per process)."""
    global _steps_started
    with _lock:
        _steps_started += 1
        if _steps_started == 2:
            _settle()


def step_ended(seconds: float) -> None:
    """Call as a barrier ends, with its wall time: the process's first step, when it ran at
    least ``LONG_STEP_SECONDS``, settles the heap now."""
    with _lock:
        if _steps_started == 1 and seconds >= LONG_STEP_SECONDS:
            _settle()


def _settle() -> None:
    global _settled
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
