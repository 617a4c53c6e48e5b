"""A table's commit finished by a background thread after the caller returns, settled before
anything in this process opens the table again.

Why: a barrier commits its progress last, after the tables that hold the barrier's data (the
MV, an aggregate's state, a join's indexes). Each of those holds the barrier by its own app
transaction, and recovery completes a barrier the progress lacks (mv/recovery.py, the
aggregate and join barriers' `run`), so the MV is current, and a crash loses nothing, as soon
as they landed: the progress commit is bookkeeping on the barrier's serial path. Run by
`commit_later`, it overlaps whatever the caller does next (the next upstream batch, the
figures, the next barrier's opening).

What keeps it honest: every open of the table in this process (`owned_tables.open_if_exists`,
which the barriers, the figures, the checks and the verify jobs go through) first waits for
the commits pending on it (`settle`), raising what one of them raised; the interpreter waits
for them at exit (the executor's threads are joined then); `settle_all` waits for every one
(a test's fresh start, a job that must see them written). Another process sees the progress
behind the MV only in the window it always could (between the two commits), which recovery
was made for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

LOG = logging.getLogger(__name__)


def commit_later(uri: str, commit: Callable[[], object]) -> None:
    """Run ``commit`` (a commit of the table at ``uri``) in the background thread, after the
    commits submitted before it (one thread: a table's commits land in submission order)."""
    future = _WRITER.submit(_logged, uri, commit)
    with _LOCK:
        _PENDING.setdefault(_key(uri), []).append(future)


def settle(uri: str) -> None:
    """Wait for the commits of ``uri`` begun so far, raising the first one's error (a
    commit that opens its own table, in the background thread, does not wait for itself)."""
    if threading.current_thread().name.startswith(_THREAD):
        return
    with _LOCK:
        pending = _PENDING.pop(_key(uri), None)
    if pending:
        _wait(pending)


def settle_all() -> None:
    """Wait for every commit begun so far, raising the first one's error."""
    with _LOCK:
        pending = [f for futures in _PENDING.values() for f in futures]
        _PENDING.clear()
    _wait(pending)


def pending(uri: str) -> bool:
    """Whether a commit of ``uri`` is begun and not yet settled."""
    with _LOCK:
        return bool(_PENDING.get(_key(uri)))


def _wait(futures: list[Future]) -> None:
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise errors[0]


def _logged(uri: str, commit: Callable[[], object]) -> None:
    try:
        commit()
    except Exception:  # raised again to whoever settles the table
        LOG.warning("background commit of %s failed", uri, exc_info=True)
        raise


def _key(uri: str) -> str:
    return uri.rstrip("/")


_PENDING: dict[str, list[Future]] = {}  # table uri -> its commits not yet settled
_LOCK = threading.Lock()
_THREAD = "commit-later"
_WRITER = ThreadPoolExecutor(1, thread_name_prefix=_THREAD)
