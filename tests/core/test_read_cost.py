"""A chunk read's cost against its chunk: when the upstream's layout bounds no_shuffle (the
mode that seeks the upstream's own files: `Mode.seeks_upstream`), and what the statement of
that bound predicts (core/read_cost.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core import read_cost
from backfill_assets.core.read_cost import ReadCost


def _cost(**kw) -> ReadCost:
    base = dict(seeks_upstream=True, chunk_rows=1_000_000, rows_scanned=20_000_000,
                rows_left=18_000_000, chunk_limit=1_000_000, table_rows=20_000_000)
    return ReadCost(**{**base, **kw})


def test_a_read_of_the_whole_table_for_a_chunk_is_bound_by_the_layout():
    """A 20M-row composite-key upstream every file of which spans the key range: 20M rows
    decoded for a chunk of 1M, 18 chunks left."""
    cost = _cost()
    assert cost.amplification == 20.0 and cost.layout_bound
    assert cost.barriers_left == 18 and cost.projected_rows == 360_000_000
    text = cost.statement()
    for figure in ("20,000,000", "1,000,000", "(20x)", "18 barriers left", "360,000,000",
                   "(18x the table)", "'arrangement'", "chunk_size"):
        assert figure in text, (figure, text)


def test_a_clustered_read_small_tables_other_modes_and_the_last_chunk_are_not():
    assert not _cost(rows_scanned=1_500_000).layout_bound  # a chunk and a file or two
    assert not _cost(seeks_upstream=False).layout_bound  # arrangement: its replica is ours
    assert not _cost(chunk_rows=100, rows_scanned=4_000, rows_left=900).layout_bound  # small
    assert not _cost(rows_left=0).layout_bound  # the read that finished the backfill
    assert _cost(chunk_rows=0).amplification == 1.0  # nothing taken: no ratio to invent


@given(chunk=st.integers(1, 10**7), scanned=st.integers(0, 10**9), left=st.integers(0, 10**9),
       limit=st.integers(1, 10**7), seeks=st.booleans())
def test_the_bound_is_said_exactly_when_its_conditions_hold(chunk, scanned, left, limit, seeks):
    cost = ReadCost(seeks, chunk, scanned, left, limit, max(1, left + chunk))
    expected = (seeks and left > 0 and scanned >= read_cost.MIN_SCANNED_ROWS
                and scanned >= read_cost.AMPLIFICATION * chunk)
    assert cost.layout_bound == expected
    assert cost.barriers_left == math.ceil(left / limit)
    assert cost.projected_rows == cost.barriers_left * scanned
    assert f"{cost.projected_rows:,}" in cost.statement()


def test_a_window_divides_the_reads_left_by_its_chunks():
    """A read that holds the next 4.25 chunks (no_shuffle's window,
    storage/chunks/cut_window.py): the 18 barriers left make 5 reads of what this one decoded,
    and the statement says why."""
    cost = _cost(window_rows=4_250_000)
    assert cost.layout_bound and cost.chunks_per_read == 4.25
    assert cost.projected_rows == 5 * 20_000_000
    text = cost.statement()
    for figure in ("holds the next 4.2 chunks", "4,250,000 rows", "change feed",
                   "100,000,000", "(5x the table)"):
        assert figure in text, (figure, text)
    assert _cost(window_rows=500_000).chunks_per_read == 1.0  # less than a chunk: no window

