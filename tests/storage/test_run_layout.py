"""The no_shuffle run layout lives where the tables live (a local folder or S3) and is recorded
by create-only writes: two runs that read the same layout cannot both record a new one."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import RescaleRefused
from backfill_assets.mv.run_layout import check_run_layout, layout_path
from backfill_assets.storage.store import documents, objects


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "mv"), None
    s3 = request.getfixturevalue("s3_server")
    return s3.fresh_uri("layout"), dict(s3.storage_options)


def test_the_layout_is_recorded_in_the_store_and_refuses_a_resplit(root, tmp_path, monkeypatch):
    base, opts = root
    monkeypatch.chdir(tmp_path)  # nothing may land on this host's disk for an s3:// root
    check_run_layout(base, range(0, 8), lambda g: set(), opts)
    check_run_layout(base, range(0, 8), lambda g: set(g), opts)  # the same set: allowed
    assert documents.read_sequence(layout_path(base), opts) == (1, [list(range(8))])
    with pytest.raises(RescaleRefused, match="in progress"):
        check_run_layout(base, range(4, 12), lambda g: set(g), opts)
    check_run_layout(base, range(4, 12), lambda g: set(), opts)  # finished: re-split allowed
    assert documents.read_sequence(layout_path(base), opts) == (2, [list(range(4, 12))])
    if opts:
        assert not any(tmp_path.rglob("*.json"))
        assert [o.uri.rsplit("/", 1)[1] for o in objects.list_prefix(base, opts)] == [
            "00000001.json", "00000002.json"]


def test_two_runs_that_read_the_same_layout_cannot_both_record(root):
    base, opts = root
    folder = layout_path(base)
    assert documents.append_sequence(folder, 1, [[0, 1]], opts) is True
    assert documents.append_sequence(folder, 1, [[2, 3]], opts) is False  # lost the race
    assert documents.read_sequence(folder, opts) == (1, [[0, 1]])


def test_a_run_that_loses_the_race_decides_again_on_the_winners_layout(root):
    base, opts = root
    folder = layout_path(base)
    check_run_layout(base, range(0, 4), lambda g: set(), opts)
    raced = []

    def unfinished(group: set[int]) -> set[int]:
        if not raced:  # another run records an overlapping set between our read and write
            raced.append(documents.append_sequence(folder, 2, [[0, 1, 2, 3, 4, 5]], opts))
            return set()
        return group

    with pytest.raises(RescaleRefused):
        check_run_layout(base, range(2, 6), unfinished, opts)
    assert raced == [True]
    assert documents.read_sequence(folder, opts) == (2, [[0, 1, 2, 3, 4, 5]])
