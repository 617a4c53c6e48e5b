"""Runtime controls of an MV: rate limit (rows/s, 0 = paused), chunk size, and how a barrier
over finished vnodes chooses between applying its changes and re-snapshotting them
(`barrier_choice`: by cost, or forced either way; core/cost_choice.py).

RisingWave changes these with Pause / Resume / Throttle mutations carried by barriers; here a
small JSON document beside the MV's tables (local folder or object store, through
`storage.store.documents`) is read at every barrier, so a change takes effect at the next barrier
without restarting anything. Run config of a single run overrides it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from enum import Enum

from backfill_assets.core.cost_choice import CHOICES
from backfill_assets.core.errors import InvalidControl
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.storage import objects, read_json, write_json

UNSET = "unset"


class SnapshotSide(Enum):
    """What a controls change does to the snapshot side. Dagster's launchpad offers the member
    *names* as the choices, hence lower case."""

    keep = "keep"  # leave paused / running as it is
    pause = "pause"  # rate 0: no snapshot rows; started vnodes still receive their changes
    resume = "resume"  # read again from the same positions (unlimited unless a rate is given)


class BarrierChoice(Enum):
    """How a barrier over finished vnodes lands its changes (`Controls.barrier_choice`), as
    the launchpad offers it."""

    keep = "keep"  # leave the control as it is
    auto = "auto"  # by cost: re-snapshot when re-reading the vnodes costs less
    apply = "apply"  # always apply the change feed
    resnapshot = "resnapshot"  # always re-read the vnodes at the barrier's version


@dataclass(frozen=True)
class Controls:
    chunk_size: int | None = None  # None: the MV definition's chunk size
    rate_limit: int | None = None  # None: unlimited; 0: paused
    barrier_choice: str | None = None  # None: auto (by cost); "apply" or "resnapshot": forced

    def validated(self) -> Controls:
        if self.barrier_choice is not None and self.barrier_choice not in CHOICES:
            raise InvalidControl(
                f"barrier_choice {self.barrier_choice!r} is not allowed: give one of "
                f"{', '.join(CHOICES)}")
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
        forced = "" if self.barrier_choice in (None, "auto") else \
            f", barrier_choice {self.barrier_choice}"
        return f"chunk {chunk} rows/vnode, rate {rate}{forced}"


def requested(current: Controls, snapshot: SnapshotSide, rate_limit: int | None = None,
              chunk_size: int | None = None, reset_chunk_size: bool = False,
              barrier_choice: BarrierChoice = BarrierChoice.keep) -> Controls:
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
    choice = current.barrier_choice if barrier_choice is BarrierChoice.keep else \
        None if barrier_choice is BarrierChoice.auto else barrier_choice.value
    return Controls(chunk, rate, choice).validated()


def controls_uri(tables: MVTables) -> str:
    """Where the MV's controls live: beside its tables, so every run, follower and sensor
    reaches them with the warehouse's storage options, on a local folder or an object store."""
    return objects.join(tables.root, "controls.json")


CHANGED_AT = "changed_at"  # when the document was written (wall clock, s): the pace's start


def read_controls(tables: MVTables) -> Controls:
    """The controls in force (defaults when none were ever set)."""
    stored = read_json(controls_uri(tables), tables.storage_options)
    if stored is None:
        return Controls()
    stored.pop(CHANGED_AT, None)
    return Controls(**stored).validated()


def controls_changed_at(tables: MVTables) -> float | None:
    """When the controls were last written (None: never, or by a version that did not say):
    a rate limit's pace starts there, so no credit from before a change (a pause, another
    rate) is spent after it (barrier/pacing.py)."""
    stored = read_json(controls_uri(tables), tables.storage_options)
    return None if stored is None else stored.get(CHANGED_AT)


def write_controls(tables: MVTables, controls: Controls) -> Controls:
    """Replace the controls atomically (a reader never sees half a document); bad values are
    refused with InvalidControl before anything is written."""
    document = {**asdict(controls.validated()), CHANGED_AT: time.time()}
    write_json(controls_uri(tables), document, tables.storage_options)
    return controls


def update_controls(tables: MVTables, *, chunk_size: int | str | None = None,
                    rate_limit: int | str | None = None) -> Controls:
    """Change some controls; `UNSET` clears one back to its default ("unlimited" rate)."""
    current = read_controls(tables)
    changes: dict = {}
    if chunk_size is not None:
        changes["chunk_size"] = None if chunk_size == UNSET else _whole(chunk_size, "chunk_size")
    if rate_limit is not None:
        changes["rate_limit"] = (None if rate_limit in (UNSET, "unlimited")
                                 else _whole(rate_limit, "rate_limit"))
    return write_controls(tables, replace(current, **changes))


def _whole(value: int | str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        words = "'unset' or 'unlimited'" if name == "rate_limit" else "'unset'"
        raise InvalidControl(
            f"{name} {value!r} is not a whole number: give e.g. 5000, or {words}") from None

