"""The platform's side of the aggregate benchmark (benchmarks/bench_aggregate.py): the
aggregate MV definition (benchmarks/agg_data.py `definition`, docs/AGGREGATES.md) run by
`run_barrier` (backfill_assets/barrier/runner.py) on a private copy of the cached upstream:
the bulk backfill (barriers until every vnode is finished), then one barrier after each batch
of the shared plan. Where this checkout cannot serve an aggregate MV yet
(`AggregateMVNotServed`), the result says so ("not served yet") instead of failing."""

from __future__ import annotations

import shutil
import time

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C
from benchmarks.agg_continuous import continuous


def _barrier(spark, d, tables, vnodes) -> dict:
    from backfill_assets.barrier.runner import run_barrier

    t0 = time.perf_counter()
    report = run_barrier(spark, d, tables, vnodes)
    return {"seconds": round(time.perf_counter() - t0, 3), "finished": report.finished,
            "engine": str(getattr(report, "engine", "")),
            "forwarded_rows": getattr(report, "forwarded_rows", None),
            "report": dict(getattr(report, "extra", {}) or {})}


def table_sizes(tables) -> dict:
    """Each of the MV's tables: its log's latest version and its live data files (what a
    barrier that opens or searches it has to go through)."""
    from deltalake import DeltaTable

    out = {}
    for name in ("mv", "aggregate_state", "aggregate_input", "progress"):
        uri = getattr(tables, name, None)
        try:
            table = DeltaTable(uri)
        except Exception:  # noqa: BLE001 - a table this checkout does not write
            continue
        out[name] = {"version": table.version(), "files": len(table.file_uris())}
    return out


def _bulk(spark, d, tables, vnodes, max_barriers: int = 400) -> dict:
    barriers = []
    for _ in range(max_barriers):
        barriers.append(_barrier(spark, d, tables, vnodes))
        if barriers[-1]["finished"]:
            break
    else:
        raise RuntimeError("the aggregate backfill did not finish")
    return {"seconds": round(sum(b["seconds"] for b in barriers), 3), "barriers": barriers}


def worker_platform(args) -> dict:
    from backfill_assets.core import errors
    from backfill_assets.mv.owned_tables import MVTables

    # the refusal exists only while aggregate MVs are not served: a checkout that serves them
    # has no such error to catch
    not_served = getattr(errors, "AggregateMVNotServed", ())

    run_dir, uri, info = R.private_upstream(args, "platform")
    d = A.definition(uri, args.vnodes)
    tables = MVTables.under(run_dir, d.name, uri)
    vnodes = list(range(args.vnodes))
    spark, _ = C.start_spark()
    C.warm_read(spark, uri)
    out: dict = {"contender": "platform", "rows": args.rows, "served": True}
    try:
        audit = C.CpuAudit()
        try:
            out["full"] = _bulk(spark, d, tables, vnodes)
        except not_served as e:
            print(f"    platform: not served yet ({type(e).__name__})", flush=True)
            return {**out, "served": False, "reason": f"{type(e).__name__}: {e}"}
        print(f"    platform bulk backfill: {out['full']['seconds']:.2f}s "
              f"({len(out['full']['barriers'])} barriers)", flush=True)
        stream = A.ChangeStream(args.rows, info["days"])
        out["idle"] = _barrier(spark, d, tables, vnodes)  # no new version: the fixed cost
        out["tables_after_bulk"] = table_sizes(tables)
        out["cases"] = R.follow_plan(args, uri, info,
                                     lambda: _barrier(spark, d, tables, vnodes), stream)
        out.update(audit.result())
        if args.commits:
            out["continuous"] = continuous(spark, d, tables, vnodes, stream, args)
            out["tables_after_continuous"] = table_sizes(tables)
            cont = out["continuous"]
            print(f"    continuous mode: commit-to-MV median {cont.get('median', 0):.3f}s, "
                  f"p95 {cont.get('p95', 0):.3f}s ({cont['commits']} commits)", flush=True)
        out["check"] = R.mismatches(spark, spark.read.format("delta").load(tables.mv), uri)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out
