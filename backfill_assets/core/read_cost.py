"""What a chunked barrier's snapshot read cost against what it took, and what that predicts.

A chunk read seeks: it decodes only the files whose key bounds can hold the chunk
(storage/chunks/seek.py). Over files sorted by key with narrow bounds (arrangement's replica,
or an upstream kept clustered by its pk) that is the chunk plus a file or two per vnode. no_shuffle
reads the upstream's own files, and when they are not clustered by the pk (a copy-on-write
writer rewrites a vnode's rows into one file in no key order; a composite pk's leading column
spans every file) every file can hold a row of every chunk. Each barrier then decodes about the
whole table to take ``chunk_limit`` rows of it, so the backfill reads about
``table_rows ** 2 / chunk_limit`` rows and its time per row grows with the table: a cost of
the layout that no engine avoids without a sorted copy of the upstream (which is arrangement's
replica). Nothing here is wrong, so the barrier does not stop; it says so, with the numbers,
once the read is large enough to matter.

Pure arithmetic: the adapters hand in the counts a barrier already reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# a read that decodes this many times the rows it takes, and at least this many rows, is
# bounded by the layout (a clustered read decodes the chunk plus a file or two per vnode)
AMPLIFICATION = 4.0
MIN_SCANNED_ROWS = 100_000


@dataclass(frozen=True)
class ReadCost:
    """One barrier's snapshot read: ``chunk_rows`` taken, ``rows_scanned`` decoded (the live
    rows of every file the read opened: the barrier's ``snapshot_rows_scanned``),
    ``rows_left`` still after the positions (whole MV). ``seeks_upstream``: the read's mode
    seeks the upstream's own files, whose layout the platform does not choose (no_shuffle;
    the mode declares it: ``Mode.seeks_upstream``)."""

    seeks_upstream: bool
    chunk_rows: int
    rows_scanned: int
    rows_left: int
    chunk_limit: int
    table_rows: int
    window_rows: int = 0  # rows the read holds for the barriers after it (0: none)

    @property
    def chunks_per_read(self) -> float:
        """Barriers one read serves: 1, or the chunks of a window
        (storage/chunks/cut_window.py)."""
        return max(1.0, self.window_rows / self.chunk_limit) if self.chunk_limit > 0 else 1.0

    @property
    def amplification(self) -> float:
        """Rows decoded per row taken (1.0 when the read took nothing it decoded)."""
        return self.rows_scanned / self.chunk_rows if self.chunk_rows else 1.0

    @property
    def layout_bound(self) -> bool:
        """Whether this read cost what the upstream's layout imposes rather than the chunk:
        a read of files the platform does not lay out (``seeks_upstream``: no_shuffle) that
        decoded ``AMPLIFICATION`` times its rows and rows enough to matter, with more chunks
        to come."""
        return (self.seeks_upstream and self.rows_left > 0
                and self.rows_scanned >= MIN_SCANNED_ROWS
                and self.amplification >= AMPLIFICATION)

    @property
    def barriers_left(self) -> int:
        return math.ceil(self.rows_left / self.chunk_limit) if self.chunk_limit > 0 else 0

    @property
    def projected_rows(self) -> int:
        """Rows the rest of the backfill will decode if every read decodes what this one
        did (over files that each span the key range, the files not yet passed are all of
        them: the read does not shrink as the position moves), one read per window."""
        return math.ceil(self.barriers_left / self.chunks_per_read) * self.rows_scanned

    def statement(self) -> str:
        """What bounds the read and what to do about it, for the run's log and metadata."""
        times = self.projected_rows / self.table_rows if self.table_rows else 0.0
        return (
            f"no_shuffle decoded {self.rows_scanned:,} upstream rows to take a chunk of "
            f"{self.chunk_rows:,} ({self.amplification:.0f}x): the upstream's files are not "
            "clustered by its primary key, so every file can hold a row of every chunk and "
            f"{self._reads()} reads about the whole table. At this chunk size the "
            f"{self.barriers_left:,} barriers left will decode about "
            f"{self.projected_rows:,} rows ({times:.0f}x the table): the backfill costs "
            f"table_rows^2 / {self._per_read()} rows read, not the table. Mode 'arrangement' "
            "reads only "
            "each chunk from its own key-sorted replica (one copy of the table, made once); "
            "a larger chunk_size divides the reads by as much; an upstream kept in key-sorted "
            "files with narrow key ranges per vnode lets no_shuffle read about the chunk alone."
        )

    def _reads(self) -> str:
        if self.chunks_per_read <= 1:
            return "each barrier"
        return (f"this read holds the next {self.chunks_per_read:.1f} chunks "
                f"({self.window_rows:,} rows, kept at each barrier's version by the change "
                "feed), so a barrier in that many")

    def _per_read(self) -> str:
        return "chunk_size" if self.chunks_per_read <= 1 else "(chunk_size x the window's chunks)"
