"""The follower's trigger: waiting on a table's next log entry returns as soon as a real
writer's commit lands (a local folder and the S3 server), and not before; a timeout and a stop
end the wait without it."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from backfill_assets.storage.delta.log_wait import wait_for_commit


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path):
    if request.param == "local":
        uri, opts = str(tmp_path / "up"), None
    else:
        s3 = request.getfixturevalue("s3_server")
        uri, opts = s3.fresh_uri("wait"), dict(s3.storage_options)
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=opts)
    return uri, opts


def _commit_later(uri: str, opts, delay: float) -> threading.Thread:
    def commit() -> None:
        time.sleep(delay)
        write_deltalake(uri, pa.table({"id": [2]}), mode="append", storage_options=opts)
    thread = threading.Thread(target=commit)
    thread.start()
    return thread


def test_the_wait_ends_when_the_next_commit_lands(table):
    uri, opts = table
    writer = _commit_later(uri, opts, 0.5)
    started = time.monotonic()
    assert wait_for_commit(uri, 1, opts, timeout=10) is True
    waited = time.monotonic() - started
    writer.join()
    assert 0.4 <= waited < 2.0, waited  # not before the commit, and at once after it
    started = time.monotonic()
    assert wait_for_commit(uri, 1, opts, timeout=10) is True  # already there: no wait
    assert time.monotonic() - started < 0.5


def test_a_timeout_and_a_stop_end_the_wait_without_a_commit(table):
    uri, opts = table
    started = time.monotonic()
    assert wait_for_commit(uri, 1, opts, timeout=0.3) is False
    assert 0.3 <= time.monotonic() - started < 2.0
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert wait_for_commit(uri, 1, opts, timeout=30, stop=stop) is False
    assert time.monotonic() - started < 2.0
