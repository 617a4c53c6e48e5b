"""The floor under no_shuffle over the benchmark writer's layout: what reading the files its
barriers must read and writing the MV once cost with nothing else done, against the same
run's Spark copy.

no_shuffle's chunk is the next ``limit`` rows in key order across the run's vnodes, read from
the upstream itself (no replica). The benchmark's writer (a delta-rs MERGE a version, as a
foreign copy-on-write writer) rewrites every vnode it touches into one file spanning the
vnode's whole key range, one row group, rows not in key order: a chunk's rows lie in every
such file, and no file or row group can be skipped (a page holds ~20 rows of every chunk, so
a row-level index would not skip pages either). A barrier therefore decodes, of the files its
seek picks (``snapshot_rows_scanned``, up to the whole table), every column the MV needs,
whatever the engine.

Given a ``bench_bulk`` results file, this script takes each no_shuffle barrier's rows read,
rebuilds the writer's layout (a copy of the cached upstream, one writer version of the run's
size), times a plain read of every file (``benchmarks/read_bound.py``: the storage layer's
way of opening a file, two threads, best of ``--repeat``) and prints:

- the read floor: the rows the barriers read x the seconds per row of that read, of the
  columns the MV needs (and, below any design, of the key columns alone);
- the write floor: the MV's rows, projected and filtered beforehand, written once as parquet
  on two threads;
- both against the run's Spark copy, and per row against ``--flat-from`` (the run at 1M rows
  the flat-time-per-row target compares with: at most 1.2x its time per row).

    python -m benchmarks.no_shuffle_floor benchmarks/results/bulk_round21_20M_no_shuffle.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import common as C
from benchmarks.read_bound import read_all

# the upstream columns bench_mv's definition reads: its columns, its filter's, its computed
MV_INPUT = ["region", "id", "name", "amount", "qty", "ts", "flag"]


def best_read(uri: str, columns: list[str] | None, repeat: int, threads: int
              ) -> tuple[int, float]:
    """Rows of the latest version of ``uri`` and the best seconds of a plain read of them."""
    from backfill_assets.storage import TableVersion

    snap = TableVersion.load(uri)
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = read_all(snap, columns, threads)
        best = min(best, time.perf_counter() - t)
    return rows, best


def writer_layout(info: dict, changes: int) -> str:
    """A copy of the cached upstream after one writer version of ``changes`` changes."""
    from backfill_assets.upstream.writer import apply_dml

    dst = os.path.join(C.WORK_DIR, f"floor_{os.getpid()}", "upstream")
    C.work_copy(info["path"], dst)
    apply_dml(dst, C.ChangeMaker(info["pk"], next_id=info["rows"]).batch(changes))
    return dst


def mv_rows_table(uri: str, rows: int):
    """``rows`` rows of bench_mv's output over ``uri`` (filter and computed columns applied
    in Arrow, untimed): what the write floor writes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from backfill_assets.storage import TableVersion

    snap = TableVersion.load(uri)
    parts, held = [], 0
    for f in snap.files:
        t = pq.ParquetFile(snap.file_uri(f.path)).read(columns=MV_INPUT)
        # one schema for every file: string views and nullability vary between writers
        t = t.cast(pa.schema([pa.field(c.name, pa.string() if pa.types.is_string_view(c.type)
                                       else c.type) for c in t.schema]))
        t = t.filter(pc.and_(pc.greater(t["qty"], 0), pc.invert(t["flag"])))
        parts.append(t)
        held += t.num_rows
        if held >= rows:
            break
    t = pa.concat_tables(parts).slice(0, rows)
    total = pc.multiply(t["amount"], pc.cast(t["qty"], pa.decimal128(10, 0)))
    return t.drop(["flag"]).append_column("total", total).append_column(
        "name_upper", pc.utf8_upper(t["name"]))


def best_write(table, threads: int, repeat: int, file_rows: int = 1_000_000) -> float:
    """Best seconds to write ``table`` as parquet files of ``file_rows`` rows on ``threads``."""
    import pyarrow.parquet as pq

    out = os.path.join(C.WORK_DIR, f"floor_write_{os.getpid()}")
    slices = [table.slice(i, file_rows) for i in range(0, table.num_rows, file_rows)]
    best = float("inf")
    try:
        for _ in range(repeat):
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            t = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda i: pq.write_table(slices[i], f"{out}/part-{i}.parquet"),
                              range(len(slices))))
            best = min(best, time.perf_counter() - t)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return best


def _per_row(results_path: str | None) -> tuple[float, int] | None:
    """(seconds per row, rows) of the no_shuffle run in ``results_path``."""
    if not results_path:
        return None
    with open(results_path) as f:
        run = min((r for r in json.load(f)["runs"] if r["mode"] == "no_shuffle"),
                  key=lambda r: r["rows"])
    return run["seconds"] / run["rows"], run["rows"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a bench_bulk results file with a no_shuffle run")
    p.add_argument("--flat-from", help="results file of the no_shuffle run at 1M rows")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    from backfill_assets.storage import TableVersion

    with open(args.results) as f:
        results = json.load(f)
    run = max((r for r in results["runs"] if r["mode"] == "no_shuffle"),
              key=lambda r: r["rows"])  # the largest run of the file
    base = next(b for b in results["baselines"]
                if b["rows"] == run["rows"] and b["pk"] == run["pk"])
    scanned = sum(b["extra"].get("snapshot_rows_scanned") or 0 for b in run["per_barrier"])
    info = C.prepare_upstream(run["rows"], run["pk"], run["vnodes"])
    layout = writer_layout(info, run["dml_changes_per_barrier"])
    try:
        rows, read = best_read(layout, MV_INPUT, args.repeat, args.threads)
        _, keys = best_read(layout, list(C.PK_SHAPES[run["pk"]]), args.repeat, args.threads)
        files = len(TableVersion.load(layout).files)
        write = best_write(mv_rows_table(layout, run["mv_rows"]), args.threads, args.repeat)
    finally:
        shutil.rmtree(os.path.dirname(layout), ignore_errors=True)
    copy = min(base["spark_copy"])
    read_floor, key_floor = scanned * read / rows, scanned * keys / rows
    floor = read_floor + write
    table = [
        [f"read of the writer's layout, MV's columns ({files} files, {rows:,} rows)",
         f"{read:.2f}", "-", "-"],
        [f"the {len(run['per_barrier'])} barriers' rows ({scanned:,}, "
         f"{scanned / rows:.1f}x the table), key columns only", f"{key_floor:.2f}",
         f"{key_floor / copy:.2f}x", "-"],
        ["the same rows, the MV's columns (read floor)", f"{read_floor:.2f}",
         f"{read_floor / copy:.2f}x", "-"],
        [f"MV's {run['mv_rows']:,} rows written once (write floor)", f"{write:.2f}",
         f"{write / copy:.2f}x", "-"],
        ["read floor + write floor", f"{floor:.2f}", f"{floor / copy:.2f}x",
         f"{floor / run['rows'] * 1e6:.2f}"],
        ["the run's backfill", f"{run['seconds']:.2f}", f"{run['seconds'] / copy:.2f}x",
         f"{run['seconds'] / run['rows'] * 1e6:.2f}"],
        ["the run's Spark copy", f"{copy:.2f}", "1.00x", "-"]]
    flat = _per_row(args.flat_from)
    if flat is not None:
        table.append([f"the no_shuffle run at {flat[1]:,} rows (per row x 1.2: the flat "
                      f"target, {flat[0] * 1.2e6:.2f} us)", "-", "-", f"{flat[0] * 1e6:.2f}"])
    C.print_table(["what", "seconds", "vs spark copy", "us per row"], table)


if __name__ == "__main__":
    main()
