"""The floor under no_shuffle over the benchmark writer's layout: what reading the files its
barriers must read costs with nothing else done, against the same run's Spark copy.

no_shuffle's chunk is the next ``limit`` rows in key order across the run's vnodes, read from
the upstream itself (no replica). The benchmark's writer (a delta-rs MERGE a version, as a
foreign copy-on-write writer) rewrites every vnode it touches into one file spanning the
vnode's whole key range, one row group, rows not in key order: a chunk's rows lie in every
such file, and no file or row group can be skipped. A barrier therefore decodes the files its
seek picks (``snapshot_rows_scanned``), up to the whole table, whatever the engine.

Given a ``bench_bulk`` results file, this script takes each no_shuffle barrier's rows read,
rebuilds the writer's layout (a copy of the cached upstream, one writer version of the run's
size), times a plain read of every file (pyarrow, two threads, every column, best of
``--repeat``; ``benchmarks/read_bound.py``) and prints:

- the read floor: the rows the barriers read x the seconds per row of that plain read;
- the write floor: the MV's rows written once, at the pyarrow copy's write rate (its time
  minus a plain read of the cached upstream, per row);
- both against the run's Spark copy.

    python -m benchmarks.no_shuffle_floor benchmarks/results/bulk_round21_20M_no_shuffle.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from benchmarks import common as C
from benchmarks.read_bound import read_all


def best_read(uri: str, repeat: int, threads: int) -> tuple[int, float]:
    """Rows of the latest version of ``uri`` and the best seconds of a plain read of them."""
    from backfill_assets.storage import Snapshot

    snap = Snapshot.load(uri)
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = read_all(snap, None, threads)
        best = min(best, time.perf_counter() - t)
    return rows, best


def writer_layout(info: dict, changes: int) -> str:
    """A copy of the cached upstream after one writer version of ``changes`` changes."""
    from backfill_assets.upstream import apply_dml

    dst = os.path.join(C.WORK_DIR, f"floor_{os.getpid()}", "upstream")
    C.work_copy(info["path"], dst)
    apply_dml(dst, C.ChangeMaker(info["pk"], next_id=info["rows"]).batch(changes))
    return dst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a bench_bulk results file with a no_shuffle run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    from backfill_assets.storage import Snapshot

    with open(args.results) as f:
        results = json.load(f)
    run = next(r for r in results["runs"] if r["mode"] == "no_shuffle")
    base = next(b for b in results["baselines"]
                if b["rows"] == run["rows"] and b["pk"] == run["pk"])
    scanned = [b["extra"].get("snapshot_rows_scanned") or 0 for b in run["per_barrier"]]
    info = C.prepare_upstream(run["rows"], run["pk"], run["vnodes"])
    _, cached_read = best_read(info["path"], args.repeat, args.threads)
    layout = writer_layout(info, run["dml_changes_per_barrier"])
    try:
        rows, read = best_read(layout, args.repeat, args.threads)
        files = len(Snapshot.load(layout).files)
    finally:
        shutil.rmtree(os.path.dirname(layout), ignore_errors=True)
    copy, pyarrow_copy = min(base["spark_copy"]), min(base["pyarrow_copy"])
    read_floor = sum(scanned) * read / rows
    write_floor = run["mv_rows"] * max(0.0, pyarrow_copy - cached_read) / info["rows"]
    C.print_table(
        ["what", "seconds", "vs spark copy"],
        [[f"plain read of the writer's layout ({files} files, {rows:,} rows)", f"{read:.2f}",
          "-"],
         [f"rows the {len(scanned)} barriers read: {sum(scanned):,} "
          f"({sum(scanned) / rows:.1f}x the table)", f"{read_floor:.2f}",
          f"{read_floor / copy:.2f}x"],
         [f"MV's {run['mv_rows']:,} rows written once", f"{write_floor:.2f}",
          f"{write_floor / copy:.2f}x"],
         ["read floor + write floor", f"{read_floor + write_floor:.2f}",
          f"{(read_floor + write_floor) / copy:.2f}x"],
         ["the run's backfill", f"{run['seconds']:.2f}", f"{run['seconds'] / copy:.2f}x"],
         ["the run's Spark copy", f"{copy:.2f}", "1.00x"]])


if __name__ == "__main__":
    main()
