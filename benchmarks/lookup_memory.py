"""The driver's peak memory in key lookups past the key cache, against the size of the files.

A catch-up over a table with more keys than the key cache holds probes every file the changed
keys meet (``storage.keyed``). At 100M rows the MV's files hold about 2M rows each
(``merge.TARGET_FILES``), so a lookup thread that reads a whole file's key column holds 16 MB
of keys plus the decoded pages; reading a row group at a time (128K rows) holds 1 MB.

The script writes a table of ``--files`` files of ``--file-rows`` rows (id, vnode) in row
groups of the platform's size, then in a fresh child process per run looks up ``--changes``
keys spread over all files with the cache set below the table's keys, and prints the child's
RSS before the lookup and its peak during it (sampled every 5 ms). Run it from two checkouts
to compare code:

    PYTHONPATH=<checkout> python -m benchmarks.lookup_memory [--files 8] [--file-rows 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa


def make_table(uri: str, files: int, file_rows: int) -> None:
    from deltalake import WriterProperties, write_deltalake

    from backfill_assets.storage.rows.write import ROW_GROUP_ROWS

    for i in range(files):
        ids = pa.array(range(i * file_rows, (i + 1) * file_rows), pa.int64())
        write_deltalake(uri, pa.table({"id": ids, "vnode": pa.array([i] * file_rows,
                                                                     pa.int32())}),
                        mode="append", writer_properties=WriterProperties(
                            max_row_group_size=ROW_GROUP_ROWS))


def child(uri: str, changes: int) -> dict:
    """One lookup of ``changes`` keys past the cache; peak RSS (MiB) before and after."""
    from backfill_assets.storage import TableVersion
    from backfill_assets.storage.rows import key_cache, keyed

    snap = TableVersion.load(uri)
    total = sum(f.num_records for f in snap.files)
    key_cache.set_limit(1 << 20)  # far below the table's keys: read past the cache
    step = max(1, total // changes)
    wanted = pa.table({"id": pa.array(range(0, total, step), pa.int64())})
    before = _rss_mib()
    peak = [before]
    done = threading.Event()

    def sample() -> None:  # the process's RSS every 5 ms while the lookup runs
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss_mib())

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    found = keyed._held(snap, ["id"], wanted)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return {"rows": total, "files": len(snap.files), "found": found.num_rows,
            "rss_before_mib": round(before, 1), "rss_peak_mib": round(peak[0], 1),
            "lookup_adds_mib": round(peak[0] - before, 1), "seconds": round(seconds, 2)}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--file-rows", type=int, default=2_000_000)
    p.add_argument("--changes", type=int, default=16_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.changes)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        uri = os.path.join(tmp, "keys")
        make_table(uri, args.files, args.file_rows)
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, "-m", "benchmarks.lookup_memory", "--child",
                                  uri, "--changes", str(args.changes)], check=True,
                                 capture_output=True, text=True)
            print(out.stdout.strip())


if __name__ == "__main__":
    main()
