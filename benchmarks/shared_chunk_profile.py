"""Where one no_shuffle chunk's time goes, piece by piece, on a given upstream version: the
seek, the driver's cut (``storage.shared_cut``), the chunk tasks' read of the rows in range
(run in this process on ``--threads`` threads, as two Spark tasks would), and a plain decode
of the same files for comparison. Nothing is written.

    python -m benchmarks.shared_chunk_profile /tmp/ns_upstream_copy --version 22 \\
        --pk id:bigint --after 10000000 [--limit 1000000] [--vnodes 256]
    python -m benchmarks.shared_chunk_profile /tmp/bench_data/up_20M_composite_256v \\
        --pk region:string id:bigint --after eu 5000000
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.names import BAD_KEY, ROW_NUMBER
from backfill_assets.step.seek_chunk import replica_schema
from backfill_assets.storage.chunks.chunk_task import cut_chunk, file_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table")
    p.add_argument("--version", type=int, default=None)
    p.add_argument("--pk", nargs="+", required=True, help="name:type per pk column")
    p.add_argument("--after", nargs="*", default=None, help="the shared position (none: start)")
    p.add_argument("--limit", type=int, default=1_000_000)
    p.add_argument("--vnodes", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    columns = [KeyColumn(*c.split(":", 1)) for c in args.pk]
    key_order = KeyOrder(tuple(columns))
    pos = None if not args.after else tuple(
        int(v) if c.type in ("int", "bigint") else v for c, v in zip(columns, args.after,
                                                                      strict=True))
    snap = storage.TableVersion.load(args.table, args.version)
    positions = {v: pos for v in range(args.vnodes)}
    seconds: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        seconds[name] = round(time.perf_counter() - start, 3)
        return out

    picked = timed("seek (chunk_files)", lambda: storage.chunk_files(
        snap.files, key_order, positions, args.limit, True))
    candidates = len(picked.distinct)
    cut = timed("driver cut (shared_cut)", lambda: storage.shared_cut(
        snap, picked.distinct, key_order, list(positions), pos, args.limit, picked.floors))
    picked = picked.only(lambda f: f.path in cut.files)
    tasks, reader = storage.chunk_tasks(snap, replica_schema(snap.arrow_schema).names,
                                        key_order, positions, args.limit, picked, True, None,
                                        args.threads, 0, cut)
    base = pa.schema([f for f in reader.out_schema if f.name not in (ROW_NUMBER, BAD_KEY)])

    def in_range(text: str) -> int:
        rows = reader._read(json.loads(text), reader._in_range)  # noqa: SLF001 - profiled
        return cut_chunk(rows, key_order, {}, 1 << 62, False)[0].num_rows

    def decode(text: str) -> int:
        return sum(file_table(reader.table_uri, reader.options, reader.physical, base,
                              f).num_rows for f in json.loads(text)["files"])

    with ThreadPoolExecutor(args.threads) as pool:
        kept = timed("tasks: rows in range, sorted", lambda: sum(pool.map(in_range, tasks)))
        decoded = timed("the same files decoded", lambda: sum(pool.map(decode, tasks)))
    print(f"cut {cut.key} ({cut.rows:,} rows); of {candidates} candidate files, the tasks "
          f"read {len(picked.distinct)} files of "
          f"{picked.rows_scanned:,} rows; kept {kept:,}; decoded {decoded:,}")
    for name, s in seconds.items():
        print(f"  {name:32s} {s:8.3f} s")


if __name__ == "__main__":
    main()
