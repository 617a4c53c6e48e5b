"""Where a join barrier's wall time goes, per phase, without cProfile's overhead: the functions
of the join barrier's path wrapped in timers (those a checkout has: it runs on older layouts
too, to compare them), the bulk barrier, then ``--rounds`` rounds of one fact barrier of
``--fraction`` of the rows and one barrier of ``--dim-changes`` dimension changes
(benchmarks/join_data.py's tables and DML, the join benchmark's), each barrier's total and
phases printed, then the final MV against Spark's recompute:

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.join_phases --rows 2000000 \\
        --customers 100000 --rounds 3

Why the split: the join's own part (both feeds read, the state rows read by key, the algebra,
the state tables' commits) and the aggregate's (its group tables' reads and commits, the
progress) bind differently, and the aggregate's is the aggregate barrier's cost. The phases
nest (``JoinStore.write`` holds an ``apply_keyed``), so they are not a partition of the
total; ``join`` and ``aggregate`` below are (plus what no wrapper covers).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import shutil
import statistics
import time

from benchmarks import common as C
from benchmarks import join_contenders as JC

_SPENT: dict[str, float] = collections.defaultdict(float)
# the join's own part and the aggregate's, each a sum of non-nested wrapped functions
JOIN = ("signed_changes", "JoinStore.read", "fact_rows", "JoinTables.apply", "JoinStore.write")
AGGREGATE = ("AggregateOutput.write", "overwrite_vnodes")


def _timed(owner: object, name: str, label: str) -> None:
    inner = getattr(owner, name, None)
    if inner is None:
        return

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t0
            _SPENT[label] += spent
            table = next((a for a in args if isinstance(a, str)), None)
            if label.startswith("JoinStore.") and table:  # per table too
                _SPENT[f"{label}[{table.rstrip('_0123456789')}]"] += spent

    setattr(owner, name, wrapper)


def _wrap() -> None:
    from backfill_assets import storage
    from backfill_assets.arrow import join_state as JS
    from backfill_assets.join import barrier as B
    from backfill_assets.join import output as O
    from backfill_assets.join import sources as S
    from backfill_assets.join import store as ST
    from backfill_assets.mv import owned_tables as OT
    from backfill_assets.storage.rows import keyed as K

    for owner, prefix, names in [
        (B, "", ["open_barrier", "fact_rows"]),
        (B._Barrier, "", ["_held", "progress_pair", "_apply", "apply_changes", "commit_tables",
                          "_write"]),
        (B.index_checkpoint, "", ["lags_at", "hold_after"]),
        (B.index_checkpoint.Lag, "Lag.", ["advanced"]),
        (JS.JoinTables, "JoinTables.", ["_joined", "_index_rows", "_dimension"]),
        (JS, "", ["_net", "_check_held", "_sides"]),
        (S, "", ["signed_changes"]), (ST.JoinStore, "JoinStore.", ["read", "write"]),
        (JS.JoinTables, "JoinTables.", ["apply", "reached_facts", "lookup_keys"]),
        (O.AggregateOutput, "AggregateOutput.", ["write", "_signed"]),
        (O.AggregateOutput, "", []), (OT, "", ["overwrite_vnodes"]),
        (storage, "", ["apply_keyed", "rows_of_keys"]), (K, "keyed.", ["locate"])]:
        for name in names:
            _timed(owner, name, prefix + name)


def _barrier(spark, d, tables, vnodes) -> tuple[float, dict, dict]:
    from backfill_assets.barrier.runner import run_barrier

    _SPENT.clear()
    t0 = time.perf_counter()
    report = run_barrier(spark, d, tables, vnodes)
    return time.perf_counter() - t0, dict(_SPENT), dict(report.extra or {})


def _print(kind: str, done: list) -> dict:
    totals = [round(t, 3) for t, _, _ in done]
    print(f"== {kind}: {totals}, median {statistics.median(totals):.3f}s")
    names = sorted({k for _, p, _ in done for k in p},
                   key=lambda k: -statistics.median(p.get(k, 0) for _, p, _ in done))
    for name in names:
        print(f"   {name:24s} " + " ".join(f"{p.get(name, 0):.3f}" for _, p, _ in done))
    parts = {part: [round(sum(p.get(k, 0) for k in keys), 3) for _, p, _ in done]
             for part, keys in (("join", JOIN), ("aggregate", AGGREGATE))}
    for part, values in parts.items():
        print(f"   [{part}] {values}, median {statistics.median(values):.3f}")
    print("   reached:", [e.get("facts_reached") for _, _, e in done])
    return {"totals": totals, "median": statistics.median(totals),
            **{f"{part}_median": statistics.median(v) for part, v in parts.items()},
            "phases": {n: statistics.median(p.get(n, 0) for _, p, _ in done) for n in names}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    JC.add_worker_args(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the medians as JSON here")
    args = parser.parse_args()
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.upstream.writer.dml import apply_dml
    from benchmarks import join_data as J

    _wrap()
    run_dir, paths, info = JC._private(args, "phases")
    d = J.definition(paths["orders"], paths["customers"], args.vnodes)
    tables = MVTables.under(run_dir, d.name, paths["orders"])
    vnodes = list(range(args.vnodes))
    spark, _ = C.start_spark()
    try:
        C.warm_read(spark, paths["orders"])
        bulk = _barrier(spark, d, tables, vnodes)
        print(f"== bulk {bulk[0]:.2f}s")
        specs = dict(zip(("orders", "customers"), J.specs(args.vnodes), strict=True))
        stream = J.Changes(args.rows, args.customers, info["days"])
        runs: dict[str, list] = collections.defaultdict(list)
        for _ in range(args.rounds):
            n = max(1, round(args.rows * args.fraction))
            apply_dml(paths["orders"], stream.facts(n)[0], spec=specs["orders"])
            runs[f"facts {n}"].append(_barrier(spark, d, tables, vnodes))
            apply_dml(paths["customers"], stream.dimension(args.dim_changes)[0],
                      spec=specs["customers"])
            runs[f"dimension {args.dim_changes}"].append(_barrier(spark, d, tables, vnodes))
        out = {kind: _print(kind, done) for kind, done in runs.items()}
        check = JC.mismatches(spark, spark.read.format("delta").load(tables.mv), paths)
        print(check)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump({"args": vars(args), "bulk_seconds": round(bulk[0], 3),
                           "barriers": out, "check": check}, f, indent=1)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
