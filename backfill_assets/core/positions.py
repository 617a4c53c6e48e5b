"""Position strategies: how snapshot chunks move the positions of a run's vnodes.

Why two strategies behind one interface: the step loop is the same for every mode
(docs/DESIGN.md, "Shape of the code"); only where positions live differs.

* ``PerVnodePositions`` (arrangement): each vnode reads its own chunk strictly after its own
  position, limited per vnode, and finishes when its chunk comes back short. Vnodes are
  independent, so ranges can be re-split between runs.
* ``SharedPosition`` (no_shuffle): one chunk is read across all unfinished vnodes of the run in
  key order, limited in total; the last key read becomes the position of every unfinished
  vnode (even those that returned no row: nothing of theirs lies before it), and a short
  chunk finishes them all. The run's vnodes must therefore always agree, which recovery
  checks (the reference asserts the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from backfill_assets.core.errors import (
    InconsistentSharedPosition,
    InvalidControl,
    InvalidSnapshotChunk,
)
from backfill_assets.core.keys import Key
from backfill_assets.core.progress import BackfillState, is_count


@dataclass(frozen=True)
class VnodeChunk:
    """What a snapshot read returned for one vnode: how many rows, the last key, and whether
    they were all the vnode had left (``exhausted``: said by the reader, which knows, not
    inferred from the count: a per-vnode read may end its chunk at a file boundary a little
    before or after ``limit`` rows, ``chunk_window``)."""

    rows: int
    last_key: Key | None
    exhausted: bool = False


def check_controls(chunk_size: object, rate_limit: object) -> None:
    if not is_count(chunk_size) or chunk_size == 0:
        raise InvalidControl(
            f"chunk_size {chunk_size!r} must be an int >= 1: fix the MV definition or control"
        )
    if rate_limit is not None and not is_count(rate_limit):
        raise InvalidControl(
            f"rate_limit {rate_limit!r} must be None (unlimited), 0 (paused) or a positive "
            "int of rows per second"
        )


def effective_chunk_size(chunk_size: int, rate_limit: int | None) -> int:
    """Rows one read may return: a rate limit below the chunk size takes precedence (the
    reference's ``create_builder``); 0 means paused."""
    check_controls(chunk_size, rate_limit)
    if rate_limit == 0:
        return 0
    if rate_limit is not None and rate_limit < chunk_size:
        return rate_limit
    return chunk_size


TAIL_DIVISOR = 4  # a vnode finishes in one barrier when at most 1/4 of a chunk more is left


class PositionStrategy(Protocol):
    """What the step loop needs from a mode."""

    name: str
    uses_replica: bool  # the snapshot is read from replicated_state (kept per vnode)
    shared: bool  # one position and one read for all the run's vnodes; limit is in total
    bulk: bool  # a read takes every remaining row of a vnode (no limit, no tail, no sort)

    def recover(self, state: BackfillState) -> Key | None:
        """Check recovered states fit the strategy; return the shared position, if any."""

    def chunk_limit(self, chunk_size: int, rate_limit: int | None, unfinished_count: int) -> int:
        """Rows to read this step (per vnode, or in total when ``shared``)."""

    def apply_chunk(
        self, state: BackfillState, chunk: Mapping[int, VnodeChunk], limit: int, tail: int = 0
    ) -> None:
        """Move positions and row counts after a snapshot read limited to ``limit`` (plus
        ``tail`` for a vnode it finishes: see ``chunk_tail``)."""


def _check_chunk(state: BackfillState, chunk: Mapping[int, VnodeChunk], limit: int) -> None:
    if limit < 1 and any(c.rows for c in chunk.values()):
        raise InvalidSnapshotChunk(
            "rows were read while the snapshot is paused (limit 0): read nothing when paused"
        )
    for vnode, c in chunk.items():
        if state.current(vnode).finished:
            raise InvalidSnapshotChunk(
                f"vnode {vnode} is Completed but a snapshot chunk was read for it: read only "
                "the unfinished vnodes of the plan"
            )
        if not is_count(c.rows) or (c.rows > 0) != (c.last_key is not None):
            raise InvalidSnapshotChunk(
                f"vnode {vnode}: chunk {c!r} must have rows >= 0 and a last_key exactly when "
                "rows > 0"
            )


def chunk_tail(limit: int, rate_limit: int | None) -> int:
    """Rows beyond ``limit`` a per-vnode read may take when they are ALL the rows its vnode
    has left: a vnode whose rest is a sliver more than a chunk (vnodes differ in size by a
    few percent) then finishes in this barrier instead of costing the run one more barrier,
    whose fixed costs would dwarf the sliver. None under a rate limit: a throttled run reads
    what it was given, exactly."""
    return 0 if rate_limit is not None else limit // TAIL_DIVISOR


def rows_to_see(limit: int, tail: int) -> int:
    """Rows after a position a read must find (when the vnode has them) to tell whether the
    vnode's rest fits in ``limit + tail``."""
    return limit + tail + 1 if tail else limit


def chunk_window(limit: int, tail: int) -> tuple[int, int]:
    """The rows a per-vnode chunk that leaves rows behind may hold: ``limit``, or any count
    within ``tail`` of it when that ends the chunk where a replica file ends. A chunk cut
    there makes the next one start at a file's first row, so it reads that one file, not the
    rest of the file it stopped in and the next (2.5 chunks of rows decoded per chunk, round
    13's profile). Under a rate limit (no tail) it is exactly ``limit``."""
    return limit - tail, limit + tail


def keep_rows(remaining: int, limit: int, tail: int, whole: bool) -> int:
    """How many of a vnode's ``remaining`` rows (after its position) a read keeps when it
    knows no file boundary: all when they are ``whole`` (every row the vnode has left) and
    fit in ``limit + tail``, else at most ``limit``."""
    return chunk_cut(remaining, limit, tail, whole)[0]


def chunk_cut(remaining: int, limit: int, tail: int, whole: bool,
              boundaries: Sequence[int] = ()) -> tuple[int, bool]:
    """How many of a vnode's ``remaining`` rows (after its position, in key order) a read
    keeps, and whether that exhausts the vnode. ``whole``: they are every row it has left;
    ``boundaries``: counts of those rows that end where a file the read took ends (every row
    of the vnode before that point was read). All of a whole rest within ``limit + tail``;
    else the largest boundary in ``chunk_window``; else ``limit``."""
    if whole and remaining <= limit + tail:
        return remaining, True
    low, high = chunk_window(limit, tail)
    fits = [k for k in boundaries if max(1, low) <= k <= min(high, remaining)]
    if fits:
        return max(fits), False
    return min(remaining, limit), False


class PerVnodePositions:
    """Arrangement backfill: one position per vnode."""

    name = "arrangement"
    uses_replica = True
    shared = False
    bulk = False

    def recover(self, state: BackfillState) -> Key | None:
        return None  # vnodes are independent: any mix of states is valid

    def chunk_limit(self, chunk_size: int, rate_limit: int | None, unfinished_count: int) -> int:
        """Per vnode: the effective chunk size, with a rate limit shared by the unfinished
        vnodes (at least 1 row each unless paused, so every vnode keeps moving)."""
        limit = effective_chunk_size(chunk_size, rate_limit)
        if rate_limit and unfinished_count > 0:
            limit = min(limit, max(1, rate_limit // unfinished_count))
        return limit

    def apply_chunk(
        self, state: BackfillState, chunk: Mapping[int, VnodeChunk], limit: int, tail: int = 0
    ) -> None:
        """``chunk`` holds every vnode that was read (0 rows included); a vnode whose read
        says it was exhausted finishes. One that left rows behind holds a count in
        ``chunk_window`` (exactly ``limit`` without a tail); an exhausted one at most
        ``limit + tail`` (its whole rest: ``keep_rows``)."""
        _check_chunk(state, chunk, limit)
        if limit < 1:
            return
        low, high = chunk_window(limit, tail)
        for vnode, c in sorted(chunk.items()):
            if c.rows > high:
                raise InvalidSnapshotChunk(
                    f"vnode {vnode} returned {c.rows} rows but the limit was {limit}"
                    f"{f' (+{tail} to finish it)' if tail else ''}: limit each vnode's "
                    "snapshot read"
                )
            if not c.exhausted and c.rows < max(1, low):
                raise InvalidSnapshotChunk(
                    f"vnode {vnode} returned {c.rows} rows of a limit of {limit} and was not "
                    "exhausted: a read that leaves rows behind returns at least "
                    f"{max(1, low)} (mark the vnode exhausted when it has no more rows)"
                )
            if c.rows:
                state.update(vnode, c.last_key, c.rows)  # type: ignore[arg-type]
            if c.exhausted:
                state.finish(vnode)


class SharedPosition:
    """NoShuffle backfill: one position shared by all vnodes of a run."""

    name = "no_shuffle"
    uses_replica = False
    shared = True
    bulk = False

    def recover(self, state: BackfillState) -> Key | None:
        """The shared position (None before the first row), refusing states that disagree."""
        progress = {v: state.current(v) for v in state.vnodes}
        finished = {v for v, p in progress.items() if p.finished}
        if finished and len(finished) < len(progress):
            raise InconsistentSharedPosition(
                f"no_shuffle vnodes {sorted(finished)} are finished but "
                f"{sorted(set(progress) - finished)} are not; one run's vnodes share a "
                "position and finish together. Run the same vnode range as before (no_shuffle "
                "cannot be re-split while in progress), or drop the MV's state to restart"
            )
        if finished:
            return None  # all done: nothing is read, positions no longer matter
        positions = {p.current_pos for p in progress.values()}
        if len(positions) > 1:
            shown = ", ".join(f"{v}: {p.current_pos!r}" for v, p in sorted(progress.items()))
            raise InconsistentSharedPosition(
                f"no_shuffle vnodes recovered with different positions ({shown}); one run's "
                "vnodes share one position. Run the same vnode range as before (no_shuffle "
                "cannot be re-split while in progress), or drop the MV's state to restart"
            )
        return positions.pop() if positions else None

    def chunk_limit(self, chunk_size: int, rate_limit: int | None, unfinished_count: int) -> int:
        """In total for the run: the effective chunk size."""
        return effective_chunk_size(chunk_size, rate_limit)

    def apply_chunk(
        self, state: BackfillState, chunk: Mapping[int, VnodeChunk], limit: int, tail: int = 0
    ) -> None:
        """``chunk`` is one read across the run's unfinished vnodes (absent vnodes: 0 rows).
        A shared read has no tail: its limit is the run's, not a vnode's."""
        _check_chunk(state, chunk, limit)
        if limit < 1:
            return
        total = sum(c.rows for c in chunk.values())
        if total > limit:
            raise InvalidSnapshotChunk(
                f"the shared snapshot read returned {total} rows but the limit was {limit}: "
                "limit the read across all vnodes of the run"
            )
        unfinished = state.unfinished_vnodes()
        last_keys = [c.last_key for c in chunk.values() if c.rows]
        if last_keys:
            shared = state.key_order.max_key(last_keys)  # type: ignore[arg-type]
            for vnode in unfinished:
                state.update(vnode, shared, chunk.get(vnode, VnodeChunk(0, None)).rows)
        if total < limit:
            for vnode in unfinished:
                state.finish(vnode)
