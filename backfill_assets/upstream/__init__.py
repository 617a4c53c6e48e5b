"""Reading any upstream (its layout and keys from its log) and, in ``writer``, the platform's
own upstream table: spec, value checks, DML and the load generator (not on the runtime path).

The layer's door: code outside ``upstream/`` imports ``backfill_assets.upstream`` (what a
backfill asks of any upstream) or ``backfill_assets.upstream.writer`` (the platform's own
upstream), never the modules behind them (``tests/core/test_layers.py``)."""

from __future__ import annotations

from backfill_assets.upstream.layout import keys_kept_unique, same_vnodes

__all__ = ["keys_kept_unique", "same_vnodes"]
