"""Backfilled materialized views over Delta tables (see docs/ARCHITECTURE.md)."""

import os

# Allocators read these when their library loads, which any submodule may trigger: Arrow's
# pool is jemalloc (it can hand pages back; the driver makes it do so within 0.1 s) and
# delta-rs' jemalloc hands them back after 0.1 s, not ten seconds (storage/store/memory.py)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:100")
