"""Scaling: time per row across table sizes (from the bulk results) and across vnode counts.

    make bench-scaling BENCH_SCALE_ROWS=5000000
    .venv/bin/python -m benchmarks.bench_scaling --rows 100000 --vnodes 64 256 1024

Size scaling is read from the bulk results (benchmarks/results/bulk.json and bulk_20M.json; run
`make bench-bulk` first): µs per upstream row for each pk shape and mode at each size, and its
ratio to the smallest size.
Vnode scaling runs the bulk benchmark's workers (fresh process each, under the Spark lock) on
one size (default 1M rows, one barrier) with 64, 256 and 1024 vnodes (the upstream is
generated with the same vnode count, as no_shuffle requires), with the Spark-copy baseline of
each layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks import common as C
from benchmarks.bench_bulk import MODES


def size_scaling(paths: list[str]) -> list[list]:
    found: dict = {}  # one run per (rows, pk, mode): a later file wins
    for path in paths:
        if not os.path.exists(path):
            print(f"(no {path}: run `make bench-bulk` for size scaling)")
            continue
        with open(path, encoding="utf-8") as f:
            for r in json.load(f)["runs"]:
                if "failed" not in r:
                    found[(r["rows"], r["pk"], r["mode"])] = r
    runs = list(found.values())
    out = []
    for pk in sorted({r["pk"] for r in runs}):
        for mode in MODES:
            mine = sorted((r for r in runs if r["pk"] == pk and r["mode"] == mode),
                          key=lambda r: r["rows"])
            if not mine:
                continue
            base = mine[0]["seconds"] / mine[0]["rows"]
            for r in mine:
                per = r["seconds"] / r["rows"]
                out.append([C.human_rows(r["rows"]), pk, mode, r["vnodes"], r["seconds"],
                            round(per * 1e6, 2), f"{per / base:.2f}x"])
    return out


def run(args) -> dict:
    res: dict = {"machine": C.machine_info(), "args": vars(args), "vnode_runs": [],
                 "baselines": []}
    prev = C.Previous(args.name, args.fresh)
    print("Size scaling (from the bulk results)")
    rows = size_scaling(args.bulk)
    C.print_table(["rows", "pk", "mode", "vnodes", "seconds", "µs/row", "vs smallest"], rows)
    res["size_scaling"] = rows
    for vn in args.vnodes:
        common = ["--rows", str(args.rows), "--pk", args.pk, "--vnodes", str(vn)]
        print(f"== {C.human_rows(args.rows)} rows, {vn} vnodes", flush=True)
        C.run_worker("benchmarks.bench_bulk", ["worker-prepare", *common])
        base = prev.find("baselines", vnodes=vn) or {
            "vnodes": vn, **C.run_clean("benchmarks.bench_bulk",
                                        ["worker-baselines", *common, "--repeat",
                                         str(args.repeat)])}
        res["baselines"].append(base)
        for mode in args.modes:
            extra = ["--mode", mode, "--dml-fraction", str(args.dml_fraction),
                     "--barrier-rows", str(args.barrier_rows)]
            r = prev.find("vnode_runs", rows=args.rows, pk=args.pk, mode=mode, vnodes=vn)
            if r:
                res["vnode_runs"].append(r)
                continue
            try:
                r = C.run_clean("benchmarks.bench_bulk", ["worker-backfill", *common, *extra])
            except RuntimeError as exc:
                r = {"rows": args.rows, "pk": args.pk, "mode": mode, "vnodes": vn,
                     "failed": str(exc)}
            res["vnode_runs"].append(r)
        path = C.save_results(args.name, res)
    print_report(res)
    print(f"\nresults: {path}")
    return res


def print_report(res: dict) -> None:
    bases = {b["vnodes"]: min(b["spark_copy"]) for b in res["baselines"]}
    print("\nVnode scaling")
    C.print_table(
        ["rows", "pk", "mode", "vnodes", "barriers", "seconds", "µs/row", "spark copy s",
         "vs spark copy", "driver peak MiB"],
        [[C.human_rows(r["rows"]), r["pk"], r["mode"], r["vnodes"], r.get("barriers", "-"),
          r.get("seconds", "FAILED"),
          round(r["seconds"] / r["rows"] * 1e6, 2) if "seconds" in r else "-",
          bases.get(r["vnodes"], "-"),
          f"{r['seconds'] / bases[r['vnodes']]:.2f}x" if "seconds" in r else "-",
          r.get("driver_peak_mib", "-")] for r in res["vnode_runs"]])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--vnodes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--pk", default="single", choices=C.PK_SHAPES)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--barrier-rows", type=int, default=0,
                   help="snapshot rows per barrier (default 0: one barrier, so that the vnode "
                        "count is the only thing that changes)")
    p.add_argument("--dml-fraction", type=float, default=0.0001)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--bulk", nargs="+",
                   default=[os.path.join(C.RESULTS_DIR, f) for f in ("bulk.json", "bulk_20M.json")],
                   help="bulk results to read the size scaling from (1M/5M and 20M runs)")
    p.add_argument("--name", default="scaling")
    p.add_argument("--fresh", action="store_true", help="ignore results of an earlier run")
    run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
