"""The create-only PUT of a commit, across a store that stops answering for a while.

Why: obstore gives up on a conditional (create-only) PUT at the first connect timeout (a store
cut off for a few seconds failed the commit with a raw ``GenericError``, tests/scale/
test_hosts.py cuts the store just as a log entry is published), and when a connection drops
after the request was sent it retries on its own and reports the name taken by the very PUT
whose answer was lost: the commit then counted its own entry as another writer's. Retrying a
create-only PUT is safe, and a taken name is read back: our own bytes mean the commit landed
(True), other bytes mean another writer won (False). Log entries never repeat bytes (each
names fresh data files and its own commit time). A store silent for PUT_RETRY_SECONDS fails
the commit with ``StoreUnavailable``; whatever landed is found by the next run.
"""

from __future__ import annotations

import time

from backfill_assets.core.errors import StoreUnavailable

PUT_RETRY_SECONDS = 120.0  # the outage a commit rides out before it is refused by name
FIRST_DELAY, MAX_DELAY = 0.5, 8.0


def put_create(store, key: str, data: bytes, uri: str,
               retry_seconds: float = PUT_RETRY_SECONDS) -> bool:
    """``data`` at ``key`` of ``store`` (an obstore store) only if nothing is there: True when
    written (by this call, also by an attempt whose answer was lost), False when the name holds
    other bytes. Raises StoreUnavailable after ``retry_seconds`` of failed attempts."""
    from obstore import get, put
    from obstore.exceptions import AlreadyExistsError, GenericError

    deadline = time.monotonic() + retry_seconds
    delay, failed = FIRST_DELAY, None
    while True:
        try:
            put(store, key, data, mode="create")
            return True
        except AlreadyExistsError:
            try:
                return bytes(get(store, key).bytes()) == data
            except GenericError as exc:  # gone silent between the two: ask again
                failed = exc
        except GenericError as exc:
            failed = exc
        if time.monotonic() + delay > deadline:
            raise StoreUnavailable(
                f"{uri}: the store did not answer for {retry_seconds:.0f} s while this commit "
                f"was being published ({str(failed).splitlines()[0]}). Whether its log entry "
                "landed or not, the tables are whole: rerun once the store answers, the next "
                "run continues from what it finds.") from failed
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
