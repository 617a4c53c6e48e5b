"""The test-only kill hook: production code calls it at every commit boundary of a step.

`BACKFILL_TEST_KILL_AT=<point>[@<n>]` (read by settings) makes the process SIGKILL itself the
n-th time (default 1st) it reaches `<point>`; unset, the hook is a no-op function. Points:
before_write, after_replica_commit, after_agg_state_commit, after_agg_input_commit (an
aggregate MV's group state and kept input; agg_state_dv_file_written inside the first),
after_join_index_0_commit, after_join_dimension_0_commit (a join MV's state tables;
join_index_0_dv_file_written inside the first),
after_mv_commit, before_progress_commit, after_progress_commit, and inside the MV's
storage-layer commit: mv_data_files_written, mv_change_files_written, mv_dv_file_written
(just before its log entry is published).

`BACKFILL_TEST_KILL_AT=pause:<point>[@<n>]` pauses there instead: the step writes the file
`<temp dir>/backfill-paused-<point>` and waits until the test deletes it (at most
PAUSE_LIMIT_SECONDS). Why: a fault that must land at one commit boundary (a store cut off just
as a log entry is published, tests/scale/test_hosts.py) cannot be timed from outside a run.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable

from backfill_assets.step.request import Hook, no_hook

STORAGE_KILL_POINTS = ("mv_data_files_written", "mv_change_files_written", "mv_dv_file_written")
# an aggregate MV's barrier commits its group state, then its kept input, then the MV
AGGREGATE_KILL_POINTS = ("agg_state_dv_file_written", "after_agg_state_commit",
                         "after_agg_input_commit")
# a join MV's barrier commits each index, then each dimension (join 0's named here)
JOIN_KILL_POINTS = ("join_index_0_dv_file_written", "after_join_index_0_commit",
                    "after_join_dimension_0_commit")
KILL_POINTS = ("before_write", "after_replica_commit", "after_mv_commit",
               "before_progress_commit", "after_progress_commit", *STORAGE_KILL_POINTS)
PAUSE = "pause:"
PAUSE_LIMIT_SECONDS = 900  # a test that never releases the step does not hang its run forever


def paused_marker(point: str) -> str:
    """The file whose presence holds a step paused at ``point`` (in this host's temp dir)."""
    return os.path.join(tempfile.gettempdir(), f"backfill-paused-{point}")


def _kill(point: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(point: str) -> None:
    marker = paused_marker(point)
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)


def kill_hook(spec: str | None) -> Hook:
    """The hook for a `[pause:]point[@n]` spec (no-op for None)."""
    if not spec:
        return no_hook
    act: Callable[[str], None] = _kill
    if spec.startswith(PAUSE):
        act, spec = _pause, spec[len(PAUSE):]
    point, _, nth = spec.partition("@")
    known = (*KILL_POINTS, *AGGREGATE_KILL_POINTS, *JOIN_KILL_POINTS)
    if point not in known:
        raise ValueError(f"unknown kill point {point!r}; use one of {', '.join(known)}")
    remaining = [int(nth or 1)]

    def hook(reached: str) -> None:
        if reached == point:
            remaining[0] -= 1
            if remaining[0] == 0:
                act(point)

    return hook
