"""Join MVs against what users run instead, in one run on the same rows (issue 50's targets;
docs/BENCHMARKS.md opens with them, docs/JOINS.md carries them).

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.bench_join --rows 2000000 \
        --customers 100000
    .venv/bin/python -m benchmarks.bench_join      # 20M orders, 1M customers (make bench-join)

The tables and the query (benchmarks/join_data.py): orders (20M) joined to customers (1M, key
unique), revenue and order count per customer region per day. Each contender
(benchmarks/join_contenders.py: SDP's materialized view, the delta-spark join + GROUP BY +
overwrite, the platform's `run_barrier`) runs in a fresh process under `flock $BENCH_LOCK` on
its own copies of the same cached tables and sees the same batches in the same order: the full
computation (bulk), --repeat fact batches of --fraction of the rows (0.1%: 20,000 changes),
then --repeat dimension batches of --dim-changes (1,000: customers moving region, deleted,
added). Every final MV is compared with Spark's recompute of the final tables (rows missing
either way). Results: benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import common as C
from benchmarks import join_contenders as J

CONTENDERS = ("sdp", "overwrite", "platform")
# issue 50's targets: the recompute's time over the platform's, per phase
TARGETS = {"facts": 50.0, "dimension": 20.0}


def _worker_args(args) -> list[str]:
    return ["--rows", str(args.rows), "--customers", str(args.customers), "--groups",
            str(args.groups), "--vnodes", str(args.vnodes), "--fraction", str(args.fraction),
            "--dim-changes", str(args.dim_changes), "--repeat", str(args.repeat)]


def _median(result: dict, phase: str) -> float | None:
    for case in result.get("cases", []):
        if case["phase"] == phase:
            return case["median_seconds"]
    return None


def targets(out: dict) -> dict:
    """Each target against the recompute (delta-spark's overwrite) and SDP: the ratios."""
    c = out["contenders"]
    platform = c.get("platform", {})
    res: dict = {}
    for base in ("overwrite", "sdp"):
        other = c.get(base, {})
        if "full" not in other or "full" not in platform:
            continue
        row = {"bulk_ratio": round(platform["full"]["seconds"] / other["full"]["seconds"], 3),
               "bulk_met": platform["full"]["seconds"] <= other["full"]["seconds"]}
        for phase, want in TARGETS.items():
            mine, theirs = _median(platform, phase), _median(other, phase)
            if mine and theirs:
                row[f"{phase}_speedup"] = round(theirs / mine, 1)
                row[f"{phase}_met"] = theirs / mine >= want
        res[base] = row
    return res


def print_report(out: dict) -> None:
    rows = []
    for name, r in out["contenders"].items():
        if "full" not in r:
            rows.append([name, "failed", "", "", "", ""])
            continue
        check = r.get("check", {})
        exact = (check.get("mv_not_in_oracle"), check.get("oracle_not_in_mv"))
        rows.append([name, r["full"]["seconds"], _median(r, "facts"), _median(r, "dimension"),
                     f"{exact[0]} / {exact[1]}", r.get("cpu_gauge", "-")])
    C.print_table(["contender", "bulk s", "fact barrier s (median)",
                   "dimension barrier s (median)", "rows off (mv / oracle)", "cpu gauge s"],
                  rows)
    print(out.get("targets"))


def run(args) -> dict:
    name = args.name or f"join_{C.human_rows(args.rows)}"
    out: dict = {"machine": C.machine_info(), "args": vars(args), "contenders": {}}
    n = _worker_args(args)
    out["tables"] = C.run_worker("benchmarks.bench_join", ["worker-prepare", *n])
    for contender in args.contenders:
        print(f"== {contender}", flush=True)
        try:
            result = C.run_worker("benchmarks.bench_join", [f"worker-{contender}", *n])
        except RuntimeError as e:  # one contender's failure must not lose the others'
            result = {"failed": str(e)}
            print(f"    {contender} failed: {e}", flush=True)
        out["contenders"][contender] = result
        C.save_results(name, out)
    out["targets"] = targets(out)
    path = C.save_results(name, out)
    print_report(out)
    print(f"\nresults: {path}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    workers = {"worker-prepare": J.worker_prepare, "worker-sdp": J.worker_sdp,
               "worker-overwrite": J.worker_overwrite, "worker-platform": J.worker_platform}
    for parser in (p, *(sub.add_parser(w) for w in workers)):
        J.add_worker_args(parser)
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--name", default="", help="results/<name>.json (default join_<rows>)")
    args = p.parse_args(argv)
    C.dispatch(args, workers, run)


if __name__ == "__main__":
    sys.exit(main())
