"""The driver's native memory goes back to the system when a phase frees it.

A barrier's driver work (change reads, netting, key lookups, commits) runs in Arrow (pyarrow's
memory pool) and in delta-rs (a jemalloc of its own). Both allocators keep freed pages for
reuse: pyarrow's default mimalloc per thread, jemalloc for a while per arena. A large
catch-up then adds each phase's transient peak to the process's resident size instead of
reusing the last one's. Measured on a 100M-row catch-up of three DML versions (33K change
rows, a fresh process; ``benchmarks/memory_trace.py``'s per-phase RSS): the driver peaked at
484 MiB; 368 MiB with both allocators returning pages at once, 390 MiB with a 0.1 s decay.
Python's own objects stayed under 40 MiB (tracemalloc): the rest was allocator retention.
A decay of 0 costs time (a pyarrow copy of 5M rows: 4.0 s against 1.85 s), 0.1 s little
(2.0 s).

Both allocators read their settings when they load, so the package's ``__init__`` sets them
(Arrow's pool: jemalloc; delta-rs: a 0.1 s decay) before any module loads either library.
Only the driver shortens Arrow's decay (``settle_driver_memory``, when the Spark session
starts): Spark's Python workers keep jemalloc's default, suited to bulk tasks that allocate
large batches over and over.
"""

from __future__ import annotations

import pyarrow as pa

DRIVER_DECAY_MS = 100  # freed pages kept this long: 0 made a pyarrow copy 2.2x slower


def settle_driver_memory() -> str:
    """Arrow's jemalloc (when it is this process's pool) returns freed pages soon; the
    pool's name (pyarrow's own choice where the wheel has no jemalloc, or the pool was set
    before this package was imported)."""
    pool = pa.default_memory_pool()
    if pool.backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(DRIVER_DECAY_MS)
    return pool.backend_name
