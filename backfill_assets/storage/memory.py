"""The driver's native memory goes back to the system when a phase frees it.

A barrier's driver work (change reads, netting, key lookups, commits) runs in Arrow (pyarrow's
memory pool) and in delta-rs (a jemalloc of its own). Both allocators keep freed pages for
reuse: pyarrow's default mimalloc per thread, jemalloc for a while per arena. A large
catch-up then adds each phase's transient peak to the process's resident size instead of
reusing the last one's. Measured on a 100M-row catch-up of three DML versions (33K change
rows; ``benchmarks/bench_bulk.py``'s per-phase RSS): the driver grew 216 MiB; 102-119 MiB
with both allocators returning pages at once, for 0.1-0.2 s more. Python's own objects
stayed under 40 MiB (tracemalloc): the rest was allocator retention.

Both allocators read their settings when they first allocate, so the package's ``__init__``
sets them (Arrow's pool: jemalloc; delta-rs: no decay) before any module loads either
library. Only the driver makes Arrow's jemalloc return pages at once
(``settle_driver_memory``, when the Spark session starts): Spark's Python workers keep
Arrow's default decay, suited to bulk tasks that allocate large batches over and over.
"""

from __future__ import annotations

import pyarrow as pa


def settle_driver_memory() -> str:
    """Arrow's jemalloc (when it is this process's pool) returns freed pages at once; the
    pool's name (pyarrow's own choice where the wheel has no jemalloc, or the pool was set
    before this package was imported)."""
    pool = pa.default_memory_pool()
    if pool.backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(0)
    return pool.backend_name
