"""Benchmarks of the vnode backfill (see docs/BENCHMARKS.md for figures and commands)."""

import backfill_assets  # noqa: F401  - first: the allocators' settings before pyarrow loads
