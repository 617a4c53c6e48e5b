"""Runtime controls of an MV: rate limit (rows/s, 0 = paused) and chunk size.

RisingWave changes these with Pause / Resume / Throttle mutations carried by barriers; here a
small JSON document beside the MV's tables is read at every barrier, so a change takes effect at
the next barrier without restarting anything. Run config of a single run overrides it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace

from backfill_assets.errors import InvalidControl

UNSET = "unset"


@dataclass(frozen=True)
class Controls:
    chunk_size: int | None = None  # None: the MV definition's chunk size
    rate_limit: int | None = None  # None: unlimited; 0: paused

    def validated(self) -> Controls:
        if self.chunk_size is not None and self.chunk_size < 1:
            raise InvalidControl(
                f"chunk size {self.chunk_size} is not allowed: give a whole number >= 1"
            )
        if self.rate_limit is not None and self.rate_limit < 0:
            raise InvalidControl(
                f"rate limit {self.rate_limit} is not allowed: give rows per second >= 0 "
                "(0 pauses the snapshot side), or 'unlimited'"
            )
        return self


def controls_path(mv_root: str) -> str:
    return os.path.join(mv_root, "controls.json")


def read_controls(mv_root: str) -> Controls:
    """The controls in force (defaults when none were ever set)."""
    path = controls_path(mv_root)
    if not os.path.exists(path):
        return Controls()
    with open(path, encoding="utf-8") as f:
        return Controls(**json.load(f)).validated()


def write_controls(mv_root: str, controls: Controls) -> Controls:
    """Atomically replace the controls (a reader never sees half a file)."""
    controls.validated()
    os.makedirs(mv_root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=mv_root, prefix=".controls-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(controls), f)
    os.replace(tmp, controls_path(mv_root))
    return controls


def update_controls(mv_root: str, *, chunk_size: int | str | None = None,
                    rate_limit: int | str | None = None) -> Controls:
    """Change some controls; `UNSET` clears one back to its default ("unlimited" rate)."""
    current = read_controls(mv_root)
    changes: dict = {}
    if chunk_size is not None:
        changes["chunk_size"] = None if chunk_size == UNSET else int(chunk_size)
    if rate_limit is not None:
        changes["rate_limit"] = None if rate_limit in (UNSET, "unlimited") else int(rate_limit)
    return write_controls(mv_root, replace(current, **changes))
