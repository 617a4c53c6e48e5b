"""mv/commit_later.py: commits left to a background thread land in submission order, and
whoever settles the table gets what one of them raised, once."""

from __future__ import annotations

import threading

import pytest

from backfill_assets.mv import commit_later


def test_commits_land_in_order_and_settle_waits_for_them():
    done: list[int] = []
    gate = threading.Event()
    commit_later.commit_later("mem://t/", lambda: (gate.wait(5), done.append(1)))
    commit_later.commit_later("mem://t", lambda: done.append(2))
    assert commit_later.pending("mem://t")
    gate.set()
    commit_later.settle("mem://t/")
    assert done == [1, 2] and not commit_later.pending("mem://t")


def test_an_error_is_raised_to_the_first_settle_only():
    def fail() -> None:
        raise OSError("lost")

    commit_later.commit_later("mem://u", fail)
    with pytest.raises(OSError, match="lost"):
        commit_later.settle_all()
    commit_later.settle("mem://u")  # nothing pending any more
