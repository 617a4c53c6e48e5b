"""Backfilled materialized views over Delta tables (see docs/ARCHITECTURE.md)."""

import os

# Allocators read these when their library loads, which any submodule may trigger: Arrow's
# pool is jemalloc (it can hand pages back; the driver makes it do so within 0.1 s) and
# delta-rs' jemalloc hands them back after 0.1 s, not ten seconds, from the threads that
# free them, not from its background threads (storage/store/memory.py says why)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
os.environ.setdefault("_RJEM_MALLOC_CONF",
                      "background_thread:false,dirty_decay_ms:100,muzzy_decay_ms:100")
