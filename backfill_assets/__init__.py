"""Backfilled materialized views over Delta tables (see docs/ARCHITECTURE.md)."""

import os

# Allocators read these when their library first allocates, which any submodule may trigger:
# Arrow's pool is jemalloc (it can hand pages back; the driver makes it do so at once) and
# delta-rs' jemalloc returns freed pages at once, not ten seconds later (storage/memory.py)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
