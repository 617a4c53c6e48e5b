"""Progress figures of an MV after a barrier: percent done, rows/s, ETA, lag, vnode states.

Pure arithmetic over facts the adapters read (progress rows, commit times, upstream versions),
so the edge cases people notice first (paused, idle, finished, the first barrier) are tested
without Spark or Delta. RisingWave shows the same facts in `rw_ddl_progress`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FINISHED = "finished"
IN_PROGRESS = "in progress"
NOT_STARTED = "not started"
PAUSED = "paused"
BACKFILLING = "backfilling"
MAINTAINING = "finished, following the change feed"


@dataclass(frozen=True)
class RateSample:
    """Snapshot rows done over the whole MV at one progress commit (unix seconds)."""

    at: float
    rows_done: int


def recent_rate(samples: Sequence[RateSample]) -> float:
    """Snapshot rows per wall-clock second between the oldest and newest sample.

    Wall clock (not step time) so run start-up and the gaps between barriers count: an ETA from
    step time alone came out ~3x too short mid-run. 0.0 when it cannot be told yet.
    """
    if len(samples) < 2:
        return 0.0
    first, last = min(samples, key=lambda s: s.at), max(samples, key=lambda s: s.at)
    elapsed = last.at - first.at
    return max(0.0, (last.rows_done - first.rows_done) / elapsed) if elapsed > 0 else 0.0


@dataclass(frozen=True)
class MVFigures:
    """The MV as a whole after a barrier (not only the run's vnodes)."""

    snapshot_rows_done: int
    upstream_rows: int  # rows of the upstream at the barrier (Delta file statistics)
    vnode_count: int
    vnodes_finished: int
    vnodes_started: int  # finished + in progress
    paused: bool  # the rate limit in force is 0
    rows_per_second: float  # recent snapshot rows per wall-clock second (see recent_rate)
    upstream_version: int  # the upstream's latest version when the barrier ended
    mv_version: int | None  # the oldest version any started vnode is at (None: none started)
    lag_seconds: float  # age of the oldest upstream commit the MV has not applied (0: none)

    def __post_init__(self) -> None:
        # paused, no snapshot row is read: the rate of the barriers before the pause beside
        # `state paused` would say the backfill still moves
        if self.paused and not self.finished:
            object.__setattr__(self, "rows_per_second", 0.0)

    @property
    def finished(self) -> bool:
        return self.vnodes_finished == self.vnode_count

    @property
    def percent_done(self) -> float:
        """Snapshot rows over upstream rows; 100 only when every vnode is finished."""
        if self.finished:
            return 100.0
        if self.upstream_rows <= 0:
            return 0.0
        return min(99.9, 100.0 * self.snapshot_rows_done / self.upstream_rows)

    @property
    def eta_seconds(self) -> float | None:
        """None while paused or while no rate is known: a number then would be invented."""
        if self.finished:
            return 0.0
        if self.paused or self.rows_per_second <= 0:
            return None
        return max(0, self.upstream_rows - self.snapshot_rows_done) / self.rows_per_second

    @property
    def lag_versions(self) -> int | None:
        """Upstream versions committed after the oldest version the MV has applied."""
        return None if self.mv_version is None else max(0, self.upstream_version - self.mv_version)

    @property
    def state(self) -> str:
        if self.finished:
            return MAINTAINING
        return PAUSED if self.paused else BACKFILLING


def compact_vnodes(vnodes: Iterable[int]) -> str:
    """`0..3, 7, 9..12`: sorted vnodes as spans of consecutive numbers, so an event or a
    decision names many vnodes in a few words."""
    spans: list[list[int]] = []
    for v in sorted(set(vnodes)):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)


def state_ranges(states: Mapping[int, str], vnode_count: int) -> str:
    """`finished 0..11; in progress 12..40; not started 41..63`: every vnode in a few words,
    so one event can say where all vnodes stand without a row per vnode."""
    by_state: dict[str, list[int]] = {FINISHED: [], IN_PROGRESS: [], NOT_STARTED: []}
    for vnode in range(vnode_count):
        by_state.setdefault(states.get(vnode, NOT_STARTED), []).append(vnode)
    return "; ".join(f"{name} {compact_vnodes(vnodes)}" for name, vnodes in by_state.items()
                     if vnodes)
