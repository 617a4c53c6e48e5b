"""Apply a barrier's changes to an aggregate MV, or recompute it, whichever the model says.

Why: applying costs about the change rows and the touched groups (each touched group's state
and kept input read by key, rewritten, its MV row finished on the driver); recomputing costs
about the upstream's rows (one Spark aggregation at the barrier's version, every table
rewritten where it differs). A bulk rewrite of the upstream, or a long catch-up, can make the
second cheaper. Both land every table at the same rows, so the choice is about time alone,
and it is recorded in the barrier's metadata (`StepReport.extra`). The unit costs are the row
MV's defaults (core/cost_choice.py); a touched group costs a few change rows' worth (its
state and kept input read and rewritten), and the driver path keeps at most
`DRIVER_CHANGE_ROWS` in memory.

Why no third path that rewrites the MV whole from the held group state past some fraction of
touched groups: with the state held (aggregate/held.py) neither path reads a table file, and
the whole rewrite would still write the touched groups' change file (the MV's feed holds only
real group updates) plus every untouched group again, where the keyed apply writes the
touched groups and one deletion vector per file they were in. The keyed write stays the
smaller; a barrier whose changes approach the upstream's size recomputes instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backfill_assets.core.cost_choice import (
    APPLY,
    APPLY_FIXED_SECONDS,
    DEFAULT_APPLY_SECONDS_PER_ROW,
    DEFAULT_RESNAPSHOT_SECONDS_PER_ROW,
    RESNAPSHOT_FIXED_SECONDS,
    RESNAPSHOT_MARGIN,
)

RECOMPUTE = "recompute"
BULK = "bulk"  # the first barrier: no state yet, one bulk aggregation
GROUP_ROWS = 4.0  # change rows' worth of work per touched group (read, rewrite, finish)
DRIVER_CHANGE_ROWS = 2_000_000  # change rows a barrier applies on the driver, at most


@dataclass(frozen=True)
class AggregateChoice:
    """The path a barrier takes and the estimates behind it (seconds)."""

    path: str
    apply_seconds: float
    recompute_seconds: float | None  # None: not estimated (applying won below its floor)
    change_rows: int
    upstream_rows: int | None

    def figures(self) -> dict[str, object]:
        """For the barrier's metadata."""
        return {"aggregate_path": self.path, "apply_estimate_s": round(self.apply_seconds, 3),
                "recompute_estimate_s": None if self.recompute_seconds is None
                else round(self.recompute_seconds, 3),
                "change_rows_estimate": self.change_rows,
                "upstream_rows_estimate": self.upstream_rows}


def choose(change_rows: int, upstream_rows: int | Callable[[], int],
           forced: str | None = None) -> AggregateChoice:
    """Apply or recompute for a barrier of about ``change_rows`` over an upstream of about
    ``upstream_rows`` rows (a count, or how to count them; both from the upstream's log);
    ``forced``: the `barrier_choice` control (apply / resnapshot), else by cost. Touched
    groups are at most the change rows (every row its own group), the estimate taken here.
    A count is asked for only when a recompute could win: counting goes through every
    upstream file's statistics, a cost that grows with the upstream, and applying below the
    recompute's fixed cost always wins (the upstream's estimate is then reported as None)."""
    apply = APPLY_FIXED_SECONDS + change_rows * (1 + GROUP_ROWS) * DEFAULT_APPLY_SECONDS_PER_ROW
    certain = forced == APPLY or (forced in (None, "auto") and change_rows <= DRIVER_CHANGE_ROWS
                                  and RESNAPSHOT_FIXED_SECONDS > apply * (1 - RESNAPSHOT_MARGIN))
    if certain and callable(upstream_rows):
        return AggregateChoice(APPLY, apply, None, change_rows, None)
    rows = upstream_rows() if callable(upstream_rows) else upstream_rows
    recompute = RESNAPSHOT_FIXED_SECONDS + rows * DEFAULT_RESNAPSHOT_SECONDS_PER_ROW
    if forced == APPLY:
        path = APPLY
    elif forced is not None and forced != "auto":
        path = RECOMPUTE
    elif change_rows > DRIVER_CHANGE_ROWS:
        path = RECOMPUTE
    else:
        path = RECOMPUTE if recompute <= apply * (1 - RESNAPSHOT_MARGIN) else APPLY
    return AggregateChoice(path, apply, recompute, change_rows, rows)
