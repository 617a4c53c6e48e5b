"""Waiting for a table's next commit: the continuous path's trigger.

Why: a follower that sleeps a poll interval between looks at the upstream adds half that
interval to every commit's way into the MV on average, the largest part of commit-to-MV when
a barrier itself is small. A Delta
commit is one new object, `_delta_log/<version>.json`, written whole (create-only), so
waiting on exactly that name is cheap: a stat per tick on a local disk (microseconds), one
HEAD request per tick on an object store. The caller still re-reads the table's state (stop
requests, controls) every `timeout`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from backfill_assets.storage.delta.log import commit_uri
from backfill_assets.storage.store import objects

LOCAL_TICK_SECONDS = 0.01  # a stat of one local file
REMOTE_TICK_SECONDS = 0.1  # one HEAD request: 10 per second while the upstream is idle


def tick_for(table_uri: str) -> float:
    """How often to look: often on a local disk, less often where each look is a request."""
    return REMOTE_TICK_SECONDS if "://" in table_uri and not table_uri.startswith("file://") \
        else LOCAL_TICK_SECONDS


def wait_for_commit(table_uri: str, version: int, storage_options: Mapping[str, str] | None,
                    *, timeout: float, stop: threading.Event | None = None,
                    tick: float | None = None) -> bool:
    """True as soon as commit `version` of the table exists; False after `timeout` seconds or
    once `stop` is set. Returns at the first look that finds it, so a commit that landed while
    the caller was busy costs no wait at all."""
    return wait_for_any_commit([(table_uri, version)], storage_options, timeout=timeout,
                               stop=stop, tick=tick)


def wait_for_any_commit(waits: Sequence[tuple[str, int]],
                        storage_options: Mapping[str, str] | None, *, timeout: float,
                        stop: threading.Event | None = None, tick: float | None = None) -> bool:
    """`wait_for_commit` over several tables (table uri, version): True as soon as any of
    those commits exists (a join MV's follower waits on its fact and every dimension)."""
    uris = [commit_uri(table_uri, version) for table_uri, version in waits]
    tick = max(tick_for(u) for u, _ in waits) if tick is None else tick
    deadline = time.monotonic() + timeout
    while True:
        if any(objects.exists(uri, storage_options) for uri in uris):
            return True
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            return False
        if stop is not None:
            if stop.wait(min(tick, left)):
                return False
        else:
            time.sleep(min(tick, left))
