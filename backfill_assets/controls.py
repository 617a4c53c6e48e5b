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
from enum import Enum

from backfill_assets.errors import InvalidControl, UnsupportedStorage

UNSET = "unset"


class SnapshotSide(Enum):
    """What a controls change does to the snapshot side. Dagster's launchpad offers the member
    *names* as the choices, hence lower case."""

    keep = "keep"  # leave paused / running as it is
    pause = "pause"  # rate 0: no snapshot rows; started vnodes still receive their changes
    resume = "resume"  # read again from the same positions (unlimited unless a rate is given)


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

    def describe(self) -> str:
        """`chunk 2000 rows/vnode, rate unlimited` (or `..., paused`) for logs."""
        chunk = "the definition's" if self.chunk_size is None else str(self.chunk_size)
        rate = ("unlimited" if self.rate_limit is None else
                "0, paused" if self.rate_limit == 0 else f"{self.rate_limit} rows/s")
        return f"chunk {chunk} rows/vnode, rate {rate}"


def requested(current: Controls, snapshot: SnapshotSide, rate_limit: int | None = None,
              chunk_size: int | None = None, reset_chunk_size: bool = False) -> Controls:
    """The controls after a change asked for from the launchpad; InvalidControl (nothing
    written) when the request contradicts itself or a value is out of range."""
    if snapshot is SnapshotSide.pause and rate_limit not in (None, 0):
        raise InvalidControl(
            f"snapshot: pause with rate_limit: {rate_limit} contradict each other: pause "
            "alone stops the snapshot; give resume (or keep) with a rate to throttle instead")
    if reset_chunk_size and chunk_size is not None:
        raise InvalidControl(
            f"chunk_size: {chunk_size} with reset_chunk_size: true contradict each other: "
            "give one of them")
    rate = current.rate_limit
    if snapshot is SnapshotSide.pause:
        rate = 0
    elif snapshot is SnapshotSide.resume:
        rate = rate_limit
    elif rate_limit is not None:
        rate = rate_limit
    chunk = None if reset_chunk_size else current.chunk_size if chunk_size is None else chunk_size
    return Controls(chunk, rate).validated()


def refuse_remote(mv_root: str, what: str) -> None:
    """These small files are local-file only so far: on an object-store warehouse they would
    land in a local folder that other machines never see, so refuse by name instead."""
    if "://" in mv_root:
        raise UnsupportedStorage(
            f"{what} are kept as files in the MV's folder, which is on an object store here "
            f"({mv_root}): not supported yet, nothing was written. Run the backfill without "
            "them (the MV definition's chunk_size / rate_limit apply), or use a local or "
            "shared-folder warehouse")


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
    refuse_remote(mv_root, "runtime controls (rate limit, pause, chunk size)")
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
        changes["chunk_size"] = None if chunk_size == UNSET else _whole(chunk_size, "chunk_size")
    if rate_limit is not None:
        changes["rate_limit"] = (None if rate_limit in (UNSET, "unlimited")
                                 else _whole(rate_limit, "rate_limit"))
    return write_controls(mv_root, replace(current, **changes))


def _whole(value: int | str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        words = "'unset' or 'unlimited'" if name == "rate_limit" else "'unset'"
        raise InvalidControl(
            f"{name} {value!r} is not a whole number: give e.g. 5000, or {words}") from None
