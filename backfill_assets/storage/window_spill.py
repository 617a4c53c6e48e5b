"""The rest of a no_shuffle window read, past the window's end: kept on local disk in key-range
buckets, so the barriers after the window load their next window from there instead of
decoding every upstream file again.

Why. Over a writer's copy-on-write layout every file spans the key range, so a window read
(storage/window_read.py) decodes the whole table to keep a few chunks of it. With only those
kept, a run reads the table once per window: at 20M rows and 4.25-chunk windows, four reads
of 20M rows, and the rows decoded grow as the table squared over the window (round 23's
composite time per row, 1.17x-1.27x that at 1M). The rows past the window are in hand during
that read: written out here, they cost one sequential write and one read of local Arrow
files, and the table is decoded once whatever its size (up to ``SPILL_MAX_BYTES``).

How. The read splits the rows it keeps by the bucket bounds it estimated (each a window's
size) and appends each bucket's rows to an Arrow IPC file of its own, unsorted, as of the
read's version. A bucket is sorted when it is loaded, and the change feed since that version
brings it to the barrier's (storage/cut_window.py keeps the feed's rows up to the spill's end
for this). The files live in a temporary directory of this process, removed when the window
goes (or the process exits; a killed process's directories are removed by the next spill).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from backfill_assets.core.keys import Key

SPILL_MAX_BYTES = 8 << 30  # local disk a window's spill takes at most (rows past it: read again)
_PREFIX = "backfill-window-"


@dataclass
class _Bucket:
    hi: Key | None  # its rows' keys are in (the previous bucket's hi, hi]; None: to the end
    path: str
    rows: int = 0


class Spill:
    """Buckets of rows past a window's end, in key order, as of one version: ``write`` while
    the read runs, ``seal`` when it ends, then ``pop`` loads them one at a time."""

    def __init__(self, schema: pa.Schema, bounds: Sequence[Key | None]):
        _remove_orphans()
        self.schema = schema
        self.directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)
        self.buckets = [_Bucket(hi, os.path.join(self.directory, f"{i}.arrow"))
                        for i, hi in enumerate(bounds)]
        self._writers: list[pa.ipc.RecordBatchFileWriter | None] = [None] * len(bounds)

    @property
    def end(self) -> Key | None:
        """The last bucket's upper bound: the spill holds every row up to it (None: all)."""
        return self.buckets[-1].hi

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.buckets)

    def write(self, pieces: Sequence[pa.Table]) -> None:
        """Append ``pieces[i]`` (rows of bucket i) to the buckets' files."""
        for i, piece in enumerate(pieces):
            if not piece.num_rows:
                continue
            if self._writers[i] is None:
                self._writers[i] = pa.ipc.new_file(self.buckets[i].path, self.schema)
            self._writers[i].write_table(piece.cast(self.schema))
            self.buckets[i].rows += piece.num_rows

    def seal(self) -> None:
        """The read is over: close the files."""
        for writer in self._writers:
            if writer is not None:
                writer.close()
        self._writers = [None] * len(self._writers)

    def pop(self) -> tuple[Key | None, pa.Table] | None:
        """The next bucket's bound and rows (unsorted; its file goes), or None when none is
        left."""
        if not self.buckets:
            return None
        bucket = self.buckets.pop(0)
        if not bucket.rows:
            return bucket.hi, self.schema.empty_table()
        # mapped, not copied: the window copies it once, as it sorts it (the mapping outlives
        # the file's name)
        rows = pa.ipc.open_file(pa.memory_map(bucket.path)).read_all()
        os.unlink(bucket.path)
        return bucket.hi, rows

    def discard(self) -> None:
        """Remove the files now (the window is dropped or read again)."""
        with contextlib.suppress(Exception):
            self.seal()
        self.buckets = []
        self._finalizer()


def _remove_orphans() -> None:
    """Remove the spill directories of processes that are gone (killed: no finalizer ran)."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(_PREFIX):
                continue
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
