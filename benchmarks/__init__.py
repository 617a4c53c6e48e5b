"""Benchmarks of the vnode backfill (see docs/BENCHMARKS.md for figures and commands)."""
