"""The driver's native memory goes back to the system when a phase frees it.

A barrier's driver work (change reads, netting, key lookups, commits) runs in Arrow (pyarrow's
memory pool) and in delta-rs (a jemalloc of its own). Both allocators keep freed pages for
reuse: pyarrow's default mimalloc per thread, jemalloc for a while per arena. A large
catch-up then adds each phase's transient peak to the process's resident size instead of
reusing the last one's: most of a large catch-up's driver peak is allocator retention, not
Python's objects (``benchmarks/memory_trace.py`` shows it per phase). Returning pages at once
(a decay of 0) costs time on every large copy; a short decay returns nearly as much for
little time.

Both allocators read their settings when they load, so the package's ``__init__`` sets them
(Arrow's pool: jemalloc; delta-rs: a 0.1 s decay, background threads off) before any module
loads either library. Why delta-rs' purging runs without its background threads: with a
short decay those threads wake and return pages all through a barrier, on the same two
cores as the barrier's serial path; they cost a warm aggregate barrier more CPU than its
own work (docs/AGGREGATES.md, "The allocator's background threads"). Without them jemalloc
returns the same pages on the decay's schedule from the threads that allocate and free
(its documented behaviour when ``background_thread`` is off), so the memory bound holds.
Only the driver shortens Arrow's decay (``settle_driver_memory``, when the Spark session
starts): Spark's Python workers keep jemalloc's default, suited to bulk tasks that allocate
large batches over and over.
"""

from __future__ import annotations

import pyarrow as pa

DRIVER_DECAY_MS = 100  # freed pages kept this long: 0 would slow every large Arrow copy


def settle_driver_memory() -> str:
    """Arrow's jemalloc (when it is this process's pool) returns freed pages soon; the
    pool's name (pyarrow's own choice where the wheel has no jemalloc, or the pool was set
    before this package was imported)."""
    pool = pa.default_memory_pool()
    if pool.backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(DRIVER_DECAY_MS)
    return pool.backend_name
