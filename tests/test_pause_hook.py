"""BACKFILL_TEST_KILL_AT=pause:<point>: the step waits at that boundary until its marker file is
deleted (backfill_assets/testing/kill_hook.py), so a test can land a fault there (the host
tests cut the store just as a commit is published: tests/scale/test_hosts.py)."""

from __future__ import annotations

import os
import threading
import time

from backfill_assets.testing.kill_hook import kill_hook, paused_marker


def test_a_paused_step_waits_at_its_point_until_released(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    hook, passed = kill_hook("pause:after_mv_commit@2"), []
    points = ("before_write", "after_mv_commit", "after_mv_commit", "after_progress_commit")

    def step() -> None:
        for point in points:
            hook(point)
            passed.append(point)

    worker = threading.Thread(target=step, daemon=True)
    worker.start()
    marker = paused_marker("after_mv_commit")
    deadline = time.monotonic() + 10
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "the step never paused"
        time.sleep(0.01)
    assert marker.startswith(str(tmp_path))
    time.sleep(0.3)
    assert passed == ["before_write", "after_mv_commit"]  # held at the second time, not the first
    os.remove(marker)
    worker.join(5)
    assert passed == list(points)
