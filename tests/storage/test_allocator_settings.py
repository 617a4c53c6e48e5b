"""The allocator settings the package sets before delta-rs loads (storage/store/memory.py)."""

from __future__ import annotations

import os


def test_delta_rs_jemalloc_purges_without_background_threads() -> None:
    """delta-rs' jemalloc keeps its short decay (the memory bound) and runs no background
    thread (those contend with the barrier's serial path on the driver's cores)."""
    import backfill_assets  # noqa: F401  (sets the environment on import)

    conf = os.environ["_RJEM_MALLOC_CONF"].split(",")
    assert "background_thread:false" in conf
    assert "dirty_decay_ms:100" in conf

