"""Snapshot mode, pure part: the bulk position strategy, slice planning, history safety.

Why a bulk strategy: RisingWave's snapshot backfill (its default) reads one pinned snapshot
in bulk and replays the change log afterwards, instead of re-reading and sorting what is left
at every barrier. Here a bulk read takes *every* remaining row of a vnode at the barrier's
version (no key sort, no replica, no chunk limit), so the vnode is Completed at that version
in the same commit; its position is the last key in key order, found by an aggregate (no sort;
``last_key_sort_sql``).

Why slices: one commit for the whole table would make a crash lose all of it; one commit per
vnode costs a Spark job and two Delta commits per vnode. A slice is a contiguous vnode range
sized by estimated rows (``plan_slices``), so a crash loses at most the slice in flight.

Why a history check: catch-up replays the change feed from the pinned version, so the feed
must outlive the snapshot. ``history_safety`` compares the expected duration with the
upstream's log and file retention before starting; when the feed is gone anyway, the adapter
re-snapshots the vnodes concerned (never drops changes silently).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backfill_assets.core.errors import InvalidSnapshotChunk
from backfill_assets.core.keys import Key, KeyOrder
from backfill_assets.core.positions import VnodeChunk, check_controls
from backfill_assets.core.progress import BackfillState, is_count

# A read without a limit: what `StepPlan.chunk_limit` holds for a bulk step.
BULK_LIMIT = 2**62
# About a minute of Spark work on 2 cores (a plain Spark copy moves ~1M rows/s).
DEFAULT_SLICE_ROWS = 50_000_000
# Change rows one catch-up step reads at most (estimated from the log): a step holds its change
# rows on the driver (~2 KB each at its peak, beside ~75 MiB a step needs anyway, measured at
# 100M rows), so this bounds the driver's memory however many versions a catch-up coalesces.
CATCH_UP_STEP_ROWS = 16_384
# The throughput the history check assumes (rows/s): below the copy's, on purpose.
EXPECTED_ROWS_PER_SECOND = 250_000
# Delta's defaults when a table does not set them.
DEFAULT_LOG_RETENTION = "interval 30 days"
DEFAULT_FILE_RETENTION = "interval 1 week"
LOG_RETENTION_KEY = "delta.logRetentionDuration"
FILE_RETENTION_KEY = "delta.deletedFileRetentionDuration"


class BulkPositions:
    """Snapshot mode's bulk path: a read takes all remaining rows, so every vnode it reads
    (rows or not) is Completed at the step's version, its position the last key read."""

    name = "snapshot"
    uses_replica = False
    shared = False
    bulk = True

    def recover(self, state: BackfillState) -> Key | None:
        return None  # vnodes are independent

    def chunk_limit(self, chunk_size: int, rate_limit: int | None, unfinished_count: int) -> int:
        """No limit: a rate limit or a pause selects the chunked path before a bulk step."""
        check_controls(chunk_size, rate_limit)
        return 0 if rate_limit == 0 else BULK_LIMIT

    def apply_chunk(self, state: BackfillState, chunk: Mapping[int, VnodeChunk],
                    limit: int, tail: int = 0) -> None:
        """``chunk``: every vnode that was read; each one finishes."""
        for vnode, c in sorted(chunk.items()):
            if state.current(vnode).finished or not is_count(c.rows) or \
                    (c.rows > 0) != (c.last_key is not None) or limit < 1:
                raise InvalidSnapshotChunk(
                    f"vnode {vnode}: bulk read {c!r} (limit {limit}) must be of an unfinished "
                    "vnode, with rows >= 0 and a last_key exactly when rows > 0"
                )
            if c.rows:
                state.update(vnode, c.last_key, c.rows)  # type: ignore[arg-type]
            state.finish(vnode)


def plan_slices(estimates: Mapping[int, int], slice_rows: int) -> list[tuple[int, ...]]:
    """Contiguous ranges of the sorted vnodes, each holding at most ``slice_rows`` estimated
    rows (a vnode alone may exceed it: a vnode is never split)."""
    if not is_count(slice_rows) or slice_rows < 1:
        raise InvalidSnapshotChunk(f"slice_rows {slice_rows!r} must be an int >= 1")
    slices: list[tuple[int, ...]] = []
    current: list[int] = []
    rows = 0
    for vnode in sorted(estimates):
        n = max(0, int(estimates[vnode]))
        if current and rows + n > slice_rows:
            slices.append(tuple(current))
            current, rows = [], 0
        current.append(vnode)
        rows += n
    if current:
        slices.append(tuple(current))
    return slices


def catch_up_slices(finished: Sequence[int], change_rows: Mapping[int, int] | None,
                    step_rows: int = CATCH_UP_STEP_ROWS) -> list[tuple[int, ...]]:
    """The Completed vnodes' catch-up as steps of at most ``step_rows`` estimated change rows each
    (contiguous vnode ranges; a vnode is never split). Why: a step nets its change rows on
    the driver (every version of a key at once), so one step over a catch-up that coalesces
    many versions of a large table holds the writer's whole volume. ``change_rows`` (per
    vnode) is None when the upstream is not partitioned by the MV's vnodes: each step would
    then read every change file, so the catch-up stays one step."""
    if not finished:
        return []
    if change_rows is None or sum(change_rows.get(v, 0) for v in finished) <= step_rows:
        return [tuple(sorted(finished))]
    return plan_slices({v: change_rows.get(v, 0) for v in finished}, step_rows)


_UNITS = {"nanosecond": 1e-9, "microsecond": 1e-6, "millisecond": 1e-3, "second": 1,
          "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*$", re.IGNORECASE)


def parse_interval(text: str | None, default: str) -> float:
    """Seconds of a Delta interval property ("interval 7 days"); ``default`` when unset.
    Unreadable text counts as 0 s, so the verdict errs on the side of "at risk"."""
    match = _INTERVAL.match(text if text else default)
    if not match or match[2].lower() not in _UNITS:
        return 0.0
    return int(match[1]) * _UNITS[match[2].lower()]


@dataclass(frozen=True)
class HistorySafety:
    """The verdict recorded before a snapshot starts."""

    expected_seconds: float
    log_retention_seconds: float
    file_retention_seconds: float

    @property
    def safe(self) -> bool:
        """The change feed from the pinned version outlives the snapshot (with a 2x margin)."""
        return 2 * self.expected_seconds < min(self.log_retention_seconds,
                                               self.file_retention_seconds)

    def message(self) -> str:
        window = min(self.log_retention_seconds, self.file_retention_seconds)
        head = (f"snapshot expected to take {self.expected_seconds:.0f}s; the upstream keeps "
                f"its log {self.log_retention_seconds:.0f}s and removed files "
                f"{self.file_retention_seconds:.0f}s")
        if self.safe:
            return head + ": ok, catch-up will find the change feed"
        return (head + f": AT RISK (less than twice the {window:.0f}s window): a vacuum or "
                "log cleanup during the snapshot makes catch-up re-snapshot the vnodes "
                f"concerned; raise {FILE_RETENTION_KEY} / {LOG_RETENTION_KEY} on the upstream")


def history_safety(rows: int, configuration: Mapping[str, str | None],
                   rows_per_second: float = EXPECTED_ROWS_PER_SECOND) -> HistorySafety:
    """Compare the expected duration of reading ``rows`` with the upstream's retention."""
    return HistorySafety(
        rows / rows_per_second if rows_per_second > 0 else float("inf"),
        parse_interval(configuration.get(LOG_RETENTION_KEY), DEFAULT_LOG_RETENTION),
        parse_interval(configuration.get(FILE_RETENTION_KEY), DEFAULT_FILE_RETENTION),
    )


def catch_up_lag(latest: int, applied: int) -> int:
    """Versions the MV is behind the upstream after a barrier."""
    return max(0, latest - applied)


def more_catch_up(lag: int, covered: int | None) -> bool:
    """Whether a barrier runs another catch-up round: the MV is more than one version behind
    and still closing in, i.e. fewer versions arrived during the last round than it covered
    (``covered`` None: the round was a bulk read, which covers everything). A round as long as
    the versions that arrive meanwhile is as close as barriers get ("within one barrier")."""
    return lag > 1 and (covered is None or lag < covered)


def last_key_sort_sql(key_order: KeyOrder) -> list[str]:
    """Spark SQL expressions whose ascending (struct) order is ``key_order``: ``max_by(key,
    struct(these))`` is then the last key in key order, found by an aggregate, without a sort.
    Descending columns are mapped to an order-reversing value: ints by bitwise NOT, decimals
    by negation, dates and timestamps by their negated epoch count, strings by their UTF-8
    hex digits complemented plus a terminator that sorts after every digit (so a prefix sorts
    after the longer string). Keys are never null here (null pks are refused before)."""
    out = []
    for c in key_order.columns:
        ref = "`" + c.name.replace("`", "``") + "`"
        if not c.descending:
            out.append(ref)
        elif c.type in ("int", "bigint"):
            out.append(f"~{ref}")
        elif c.type == "date":
            out.append(f"-unix_date({ref})")
        elif c.type == "timestamp":
            out.append(f"-unix_micros(CAST({ref} AS TIMESTAMP))")
        elif c.type == "string":
            out.append(f"concat(translate(hex({ref}), '0123456789ABCDEF', "
                       f"'FEDCBA9876543210'), 'G')")
        else:  # decimal(p,s)
            out.append(f"-{ref}")
    return out


def slice_summary(slices: Sequence[Sequence[int]], estimates: Mapping[int, int],
                  done: Mapping[int, int]) -> list[dict]:
    """One row per slice for the UI: vnode range, estimated rows, rows read, done or not
    (``done``: slice index -> rows read, for the slices committed)."""
    rows = []
    for i, s in enumerate(slices):
        rows.append({"slice": i + 1, "vnodes": f"{s[0]}..{s[-1]}" if s else "-",
                     "estimated_rows": sum(estimates.get(v, 0) for v in s),
                     "rows_read": done.get(i, 0), "done": i in done})
    return rows
