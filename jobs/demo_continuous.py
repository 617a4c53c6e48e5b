"""The demo's continuous phase (jobs/demo.py, step 5): one follower_job run per MV follows a
live writer on a warm Spark session, then stop_follower_job stops them all.

Why a module of its own: starting several Dagster runs in one process needs care (the
deadlock and lost-stdout notes below) that the rest of the demo never meets.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Writer(Protocol):
    """A thread committing to the MVs' tables until ``stop`` is set (the demo's ``_Writer``)."""

    stop: threading.Event

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def continuous_phase(instance, served, writer: Writer, seconds: int,
                     quiet: dict) -> None:
    """Continuous mode (README): one follower_job run per MV on a warm Spark session follows
    ``writer`` (a thread committing every second until its ``stop`` is set) for ``seconds``,
    then stop_follower_job stops them."""
    from backfill_assets.barrier.follower import clear_stop
    from jobs.workspace_runs import run_in_workspace
    from resources.mv import mv_tables

    print(f"\ncontinuous mode: one follower_job per MV follows a writer for {seconds} s")
    results: dict = {}

    def follow(name: str) -> None:
        config = {**quiet, "ops": {"follow_upstream": {"config": {"poll_seconds": 0.5,
                                                                  "mv": name}}}}
        results[name] = run_in_workspace(instance, "follower_job", run_config=config,
                                         raise_on_error=False)

    threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in served.names]
    with _stdout_kept():
        for i, t in enumerate(threads):  # one at a time, each settled first (see below)
            t.start()
            _wait_started(instance, i + 1)
        writer.start()
        _show_follower(instance, seconds)
        writer.stop.set()
        writer.join()
        time.sleep(2)  # let the followers take the writer's last version
        run_in_workspace(instance, "stop_follower_job", run_config={
            **quiet, "ops": {"request_follower_stop": {"config": {"mv": "all"}}}})
        for t in threads:
            t.join()
    # the stop request stays in force until withdrawn: withdraw it, so `BACKFILL_CONTINUOUS=1
    # make ui` starts the followers with that setting alone (start_follower_job does the same)
    for name in served.names:
        clear_stop(mv_tables(served.definition(name)))
    ok = all(r.success for r in results.values()) and len(results) == len(served.names)
    print(f"  followers stopped on request: {'ok' if ok else 'FAILED'}; stop requests "
          "withdrawn")


@contextmanager
def _stdout_kept() -> Iterator[None]:
    """Two runs at once in this process (the follower in a thread, stop_follower_job here)
    each redirect fds 1 and 2 into their compute log and put back what they found. When the
    follower's run ends first, stop_follower_job puts back the follower's (finished) capture
    and everything printed after it is lost (the demo once ended silently, exit 0, without its
    verdict). So the fds found here are put back here, whatever order the runs end in."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _wait_started(instance, count: int, timeout: float = 120.0) -> None:
    """Until `count` follower runs are following (their op tagged them with their MV), then
    until their event logs have stopped growing for a moment (the newest one's first
    barrier ended: a fixed pause was too short for a first barrier that runs long).

    Why: a run starting in this process configures Python logging (Dagster's run start calls
    `logging.config.dictConfig`, holding logging's global lock while it takes each handler's),
    while a run emitting an event holds its handler's lock and takes the global one: a run
    started while another emits can deadlock both. Runs here start only while the others are
    quiet: followers one by one before the writer starts, stop_follower_job after it stopped."""
    import dagster as dg

    from backfill_assets.wiring.liveness import MV_TAG

    deadline, runs = time.monotonic() + timeout, []
    while time.monotonic() < deadline and len(runs) < count:
        runs = [r for r in instance.get_runs(dg.RunsFilter(
            job_name="follower_job", statuses=[dg.DagsterRunStatus.STARTED])) if MV_TAG in r.tags]
        time.sleep(0.5)
    events, still = None, 0
    while time.monotonic() < deadline and still < _QUIET_POLLS:
        now = sum(len(instance.all_logs(r.run_id)) for r in runs)
        still, events = (still + 1 if now == events else 0), now
        time.sleep(0.5)


_QUIET_POLLS = 5  # polls half a second apart with no new event: the runs are quiet


def _show_follower(instance, seconds: int) -> None:
    """One line per follower barrier, from the runs' tags, for ``seconds``."""
    import dagster as dg

    from backfill_assets.wiring.liveness import MV_TAG

    deadline, shown = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        time.sleep(1)
        for run in instance.get_runs(dg.RunsFilter(job_name="follower_job",
                                                   statuses=[dg.DagsterRunStatus.STARTED])):
            tags, name = run.tags, run.tags.get(MV_TAG, "?")
            if tags.get("follower/barriers") not in (None, shown.get(name)):
                shown[name] = tags["follower/barriers"]
                print(f"  {name:<10} follower barrier {shown[name]:>3} "
                      f"@v{tags['follower/version']:<4} lag {tags['follower/lag_versions']} "
                      f"versions / {tags['follower/lag_seconds']} s", flush=True)
