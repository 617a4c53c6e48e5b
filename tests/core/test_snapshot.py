"""Snapshot mode's pure part: bulk positions, slices, history safety, last-key SQL."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.errors import InvalidSnapshotChunk
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.planning import plan_step
from backfill_assets.core.positions import VnodeChunk
from backfill_assets.core.progress import BackfillState, Completed, InProgress
from backfill_assets.core.snapshot import (
    BULK_LIMIT,
    BulkPositions,
    HistorySafety,
    catch_up_lag,
    catch_up_slices,
    history_safety,
    last_key_sort_sql,
    more_catch_up,
    parse_interval,
    plan_slices,
    slice_summary,
)

KO = KeyOrder((KeyColumn("k", "int"),))
BULK = BulkPositions()


def test_a_bulk_read_finishes_every_vnode_it_read() -> None:
    s = BackfillState(KO, [0, 1, 2, 3], {1: (InProgress((5,), 2), 3), 3: (Completed((1,), 1), 3)})
    plan = plan_step(s, BULK, [0, 1, 2, 3], {}, 6, 10, None)
    assert plan.chunk_limit == BULK_LIMIT and plan.snapshot_vnodes == [0, 1, 2]
    assert not plan.replicate_vnodes and BULK.recover(s) is None
    BULK.apply_chunk(s, {0: VnodeChunk(4, (9,)), 1: VnodeChunk(3, (8,)), 2: VnodeChunk(0, None)},
                     plan.chunk_limit)
    assert s.current(0) == Completed((9,), 4)
    assert s.current(1) == Completed((8,), 5)
    assert s.current(2) == Completed(KO.placeholder(), 0)


def test_bulk_limit_is_zero_only_when_paused() -> None:
    assert BULK.chunk_limit(10, 0, 3) == 0
    assert BULK.chunk_limit(10, None, 3) == BULK_LIMIT


@pytest.mark.parametrize("chunk", [VnodeChunk(2, None), VnodeChunk(0, (1,)), VnodeChunk(-1, None)])
def test_bulk_refuses_an_inconsistent_read(chunk) -> None:
    s = BackfillState(KO, [0])
    with pytest.raises(InvalidSnapshotChunk):
        BULK.apply_chunk(s, {0: chunk}, BULK_LIMIT)


def test_bulk_refuses_a_finished_vnode_or_a_paused_read() -> None:
    s = BackfillState(KO, [0], {0: (Completed((1,), 1), 2)})
    with pytest.raises(InvalidSnapshotChunk):
        BULK.apply_chunk(s, {0: VnodeChunk(0, None)}, BULK_LIMIT)
    with pytest.raises(InvalidSnapshotChunk):
        BULK.apply_chunk(BackfillState(KO, [0]), {0: VnodeChunk(0, None)}, 0)


def test_slices_are_contiguous_ranges_of_about_slice_rows() -> None:
    est = {3: 10, 0: 10, 1: 25, 2: 5, 4: 40, 5: 0}
    assert plan_slices(est, 30) == [(0,), (1, 2), (3,), (4,), (5,)]
    assert plan_slices(est, 1000) == [(0, 1, 2, 3, 4, 5)]
    assert plan_slices({}, 5) == []
    assert plan_slices({7: -3, 8: 2}, 2) == [(7, 8)]  # negative estimates count as 0


@given(st.dictionaries(st.integers(0, 300), st.integers(0, 5000), max_size=40),
       st.integers(1, 20_000), st.booleans())
def test_catch_up_steps_cover_the_finished_vnodes_within_the_byte_budget(sizes, budget,
                                                                         partitioned) -> None:
    """Every finished vnode is in exactly one step, steps are contiguous in vnode order, and a
    step exceeds the budget only when it is one vnode; without per-vnode sizes (an upstream
    not partitioned by the MV's vnodes) the catch-up stays one step."""
    finished = tuple(sorted(sizes))
    steps = catch_up_slices(finished, sizes if partitioned else None, budget)
    assert [v for s in steps for v in s] == list(finished)
    if not partitioned or sum(sizes.values()) <= budget:
        assert steps == ([finished] if finished else [])
        return
    for s in steps:
        assert len(s) == 1 or sum(sizes[v] for v in s) <= budget
    for a, b in zip(steps, steps[1:], strict=False):  # fewest steps: the next vnode did not fit
        assert sum(sizes[v] for v in a) + sizes[b[0]] > budget


@pytest.mark.parametrize("bad", [0, -1, "10", True])
def test_slice_rows_must_be_positive(bad) -> None:
    with pytest.raises(InvalidSnapshotChunk):
        plan_slices({0: 1}, bad)


@pytest.mark.parametrize(("text", "seconds"), [
    ("interval 7 days", 7 * 86400), ("interval 1 week", 604800), ("2 hours", 7200),
    ("INTERVAL 30 minutes", 1800), ("interval 0 seconds", 0), ("interval 5 fortnights", 0),
    ("soon", 0), ("interval 500 milliseconds", 0.5)])
def test_parse_interval(text, seconds) -> None:
    assert parse_interval(text, "interval 1 day") == pytest.approx(seconds)


def test_parse_interval_default() -> None:
    assert parse_interval(None, "interval 1 day") == 86400
    assert parse_interval("", "interval 2 days") == 2 * 86400


def test_history_safety_verdicts() -> None:
    ok = history_safety(1_000_000, {}, rows_per_second=1000)  # 1000 s vs 7 days / 30 days
    assert ok.safe and "ok" in ok.message()
    assert ok.file_retention_seconds == 604800 and ok.log_retention_seconds == 30 * 86400
    risky = history_safety(1_000_000, {"delta.deletedFileRetentionDuration": "interval 0 hours"},
                           rows_per_second=1000)
    assert not risky.safe and "AT RISK" in risky.message()
    assert "delta.deletedFileRetentionDuration" in risky.message()
    assert not history_safety(1, {}, rows_per_second=0).safe
    assert HistorySafety(10, 100, 100).safe and not HistorySafety(60, 100, 1000).safe


def test_catch_up_lag_and_rounds() -> None:
    assert catch_up_lag(10, 7) == 3 and catch_up_lag(7, 7) == 0 and catch_up_lag(6, 7) == 0
    assert more_catch_up(3, None)  # after the bulk read: 3 versions behind
    assert not more_catch_up(1, None) and not more_catch_up(0, 5)  # within one version
    assert more_catch_up(3, 60)  # closing in
    assert not more_catch_up(3, 3) and not more_catch_up(4, 3)  # as close as barriers get


def test_last_key_sort_sql_per_type_and_direction() -> None:
    ko = KeyOrder((KeyColumn("a", "string"), KeyColumn("b", "bigint", descending=True),
                   KeyColumn("c", "date", descending=True),
                   KeyColumn("d", "timestamp", descending=True),
                   KeyColumn("e", "string", descending=True),
                   KeyColumn("f", "decimal(10,2)", descending=True),
                   KeyColumn("g`x", "int")))
    sql = last_key_sort_sql(ko)
    assert sql[0] == "`a`" and sql[1] == "~`b`" and sql[2] == "-unix_date(`c`)"
    assert sql[3] == "-unix_micros(CAST(`d` AS TIMESTAMP))"
    assert sql[4].startswith("concat(translate(hex(`e`)") and sql[4].endswith("'G')")
    assert sql[5] == "-`f`" and sql[6] == "`g``x`"


def test_slice_summary() -> None:
    rows = slice_summary([(0, 1), (2,), ()], {0: 3, 1: 4, 2: 5}, {0: 6})
    assert rows[0] == {"slice": 1, "vnodes": "0..1", "estimated_rows": 7, "rows_read": 6,
                       "done": True}
    assert rows[1]["done"] is False and rows[1]["rows_read"] == 0
    assert rows[2]["vnodes"] == "-"
