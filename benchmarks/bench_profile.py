"""What-if profile: the Spark / delta-rs operations a bulk barrier is made of, timed alone,
next to the cheaper variants the optimisation proposals in docs/BENCHMARKS.md would use.

    make bench-profile BENCH_PROFILE_ROWS=5000000
    .venv/bin/python -m benchmarks.bench_profile --rows 100000

One fresh worker under `flock $BENCH_LOCK`, one Spark session, the same cached upstream as
bench_bulk. Every operation reads the whole table (a one-barrier backfill) and is timed twice
after a warm-up; the table shows the faster run with the driver-process CPU (Python, Arrow,
delta-rs) and the Spark JVM CPU it used, and the driver's RSS growth.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from benchmarks import baselines as B
from benchmarks import common as C


def worker(args) -> dict:
    import pyarrow as pa
    from deltalake import write_deltalake
    from pyspark.sql import functions as F

    from backfill_assets import storage
    from backfill_assets.core.keys import KeyColumn, KeyOrder
    from backfill_assets.engine.projection import KEEP, project, select_chunk, validate_expressions
    from backfill_assets.mv import owned_tables
    from backfill_assets.step.seek_chunk import replica_schema

    info = C.prepare_upstream(args.rows, args.pk, args.vnodes)
    uri, version = info["path"], info["version"]
    run_dir = os.path.join(C.WORK_DIR, f"profile_{os.getpid()}")
    os.makedirs(run_dir, exist_ok=True)
    spark, _ = C.start_spark()
    jvm = C.java_pid()
    C.warm_read(spark, uri)
    audit = C.CpuAudit()
    up = storage.open_table(uri, version)
    schema = storage.arrow_schema(up)
    carried = pa.schema([f for f in schema if f.name != "vnode"])
    key_names = list(C.PK_SHAPES[args.pk])
    key_types = [C.BENCH_COLUMNS[k] for k in key_names]
    key_order = KeyOrder(tuple(KeyColumn(k, t) for k, t in zip(key_names, key_types,
                                                                  strict=True)))
    d = C.bench_mv(args.pk, "arrangement", args.vnodes, args.rows, uri)
    mv_schema = validate_expressions(spark, d, carried)
    rschema = replica_schema(carried)
    vnodes = list(range(args.vnodes))
    fresh = dict.fromkeys(vnodes)
    big = args.rows * 2
    results: list[dict] = []
    n_table = [0]

    def new_table(schema_: pa.Schema) -> object:
        n_table[0] += 1
        return owned_tables.ensure_data_table(os.path.join(run_dir, f"t{n_table[0]}"), schema_, {},
                                          cdf=False, key_names=key_names,
                                          vnode_count=args.vnodes)

    def append_dataframe(df, table) -> int:
        snap = storage.TableVersion(table.table_uri.removeprefix("file://"), {}, table)
        intent = owned_tables.intent("p", "x", vnodes, version)
        return storage.append(spark, snap, df, key_names, intent, args.rows).rows_written

    def read():
        return storage.read_version(spark, uri, version, schema)

    def time_it(label: str, what: str, fn, setup=None) -> object:
        best = None
        value = None
        for _ in range(args.repeat):
            arg = setup() if setup else None
            rss0 = C.proc_status("self", "VmRSS")
            t0, py0, j0 = time.perf_counter(), time.process_time(), C.cpu_seconds(jvm)
            value = fn(arg) if setup else fn()
            rec = {"op": label, "what": what, "seconds": time.perf_counter() - t0,
                   "driver_cpu": time.process_time() - py0, "jvm_cpu": C.cpu_seconds(jvm) - j0,
                   "rss_growth_mib": C.mib((C.proc_status("self", "VmRSS") or 0) - (rss0 or 0))}
            if best is None or rec["seconds"] < best["seconds"]:
                best = rec
        results.append(best)
        print(f"  {label}: {best['seconds']:.2f}s", flush=True)
        return value

    out_dir = os.path.join(run_dir, "copy")
    time_it("A spark copy (baseline a)", "read_version -> write.parquet",
            lambda: B.spark_copy(spark, uri, version, out_dir))
    time_it("B read + count", "read_version().count()", lambda: read().count())
    time_it("C collect all rows to the driver", "read_version().toArrow()",
            lambda: read().toArrow().num_rows)
    # --- replica initialisation (arrangement)
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.step.modes.arrangement import ReplicaSource
    from backfill_assets.step.source_context import SourceContext

    def init_as_is(t) -> int:
        tables = MVTables(upstream=uri, replica=t.table_uri, progress="", mv="")
        ctx = SourceContext(spark, "p", tables, key_names, key_types, args.vnodes, carried,
                            version, 0, key_order)
        return ReplicaSource()._initialise(ctx, t, vnodes)

    time_it("D replica init as is", "sources.ReplicaSource._initialise (the step's code)",
            init_as_is, setup=lambda: new_table(storage.replica.table_schema(rschema)))
    time_it("E replica init, no vnode recompute", "append_dataframe(read_version())",
            lambda t: append_dataframe(read(), t), setup=lambda: new_table(rschema))
    time_it("F replica init, pk-clustered", "sortWithinPartitions(vnode, pk) + append",
            lambda t: append_dataframe(read().sortWithinPartitions("vnode", *key_names), t),
            setup=lambda: new_table(rschema))
    replica = new_table(rschema)
    append_dataframe(read(), replica)

    def replica_rows():
        return storage.read_version(spark, replica.table_uri, None, rschema, vnodes=vnodes)

    # --- snapshot read as the step does it
    time_it("G snapshot arrangement as is", "select_chunk(per vnode) + project + toArrow",
            lambda: project(select_chunk(replica_rows(), fresh, key_order, big, True), d)
            .toArrow().num_rows)
    time_it("H snapshot no_shuffle as is", "select_chunk(shared) + project + toArrow",
            lambda: project(select_chunk(read(), fresh, key_order, big, False), d)
            .toArrow().num_rows)
    time_it("I whole vnodes, no sort", "project + toArrow (all rows, _keep included)",
            lambda: project(read(), d).toArrow().num_rows)
    kept = time_it("J whole vnodes, filtered in Spark", "project + where(_keep) + toArrow",
                   lambda: project(read(), d).where(F.col(KEEP)).drop(KEEP).toArrow())
    order = [F.col(k) for k in key_names]
    time_it("K chunk stats in Spark", "groupBy(vnode).agg(count, max(struct(pk)))",
            lambda: read().groupBy("vnode").agg(F.count("*"), F.max(F.struct(*order)))
            .collect())
    # --- the per-vnode position predicate of a positioned barrier (key > current_pos_k)
    import random

    from backfill_assets.engine.projection import rows_after

    rng = random.Random(5)
    positions = {v: tuple(rng.choice(C.REGIONS) if k == "region" else rng.randrange(args.rows)
                          for k in key_names) for v in vnodes}
    literal = F.expr(" OR ".join(f"(vnode = {v} AND {key_order.sql_after(p)})"
                                 for v, p in sorted(positions.items())))
    time_it(f"P1 position filter as literals ({len(vnodes)} OR terms, before)",
            "where(OR of key > literal per vnode).count()", lambda: read().where(literal).count())
    time_it("P2 position filter as joined positions (as is)", "rows_after(...).count()",
            lambda: rows_after(read(), positions, key_order).count())
    # --- MV commit
    mv_arrow = kept.cast(mv_schema) if kept is not None else None
    time_it("L MV commit from the driver", "write_deltalake(append) of J's rows",
            lambda t: write_deltalake(t, mv_arrow, mode="append"),
            setup=lambda: new_table(mv_schema))
    time_it("M MV write off the driver (as is)", "project + where(_keep) + storage.append",
            lambda t: append_dataframe(project(read(), d).where(F.col(KEEP)).drop(KEEP), t),
            setup=lambda: new_table(mv_schema))
    n = args.rows
    time_it("N '_op' column as a Python list", "pa.array(['upsert'] * rows)",
            lambda: pa.array(["upsert"] * n, pa.string()).nbytes)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"rows": args.rows, "pk": args.pk, "vnodes": args.vnodes, "ops": results,
            **audit.result()}


def run(args) -> dict:
    res: dict = {"machine": C.machine_info(), "args": vars(args), "runs": []}
    prev = C.Previous(args.name, args.fresh)
    for rows in args.rows:
        for pk in args.pk:
            again = prev.find("runs", rows=rows, pk=pk, vnodes=args.vnodes)
            if again:
                res["runs"].append(again)
                continue
            common = ["--rows", str(rows), "--pk", pk, "--vnodes", str(args.vnodes)]
            C.run_worker("benchmarks.bench_bulk", ["worker-prepare", *common])
            r = C.run_clean("benchmarks.bench_profile",
                             ["worker", *common, "--repeat", str(args.repeat)])
            res["runs"].append(r)
            path = C.save_results(args.name, res)
    for r in res["runs"]:
        print(f"\nOperations on {C.human_rows(r['rows'])} rows ({r['pk']} pk, {r['vnodes']} "
              "vnodes), best of repeats")
        C.print_table(["operation", "what", "seconds", "driver cpu s", "jvm cpu s",
                       "driver RSS +MiB"],
                      [[o["op"], o["what"], o["seconds"], o["driver_cpu"], o["jvm_cpu"],
                        o["rss_growth_mib"]] for o in r["ops"]])
    print(f"\nresults: {path}")
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--rows", type=int, required=True)
    w.add_argument("--pk", default="single", choices=C.PK_SHAPES)
    p.add_argument("--pk", nargs="+", default=["single", "composite"], choices=C.PK_SHAPES)
    for parser in (p, w):
        parser.add_argument("--vnodes", type=int, default=256)
        parser.add_argument("--repeat", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000])
    p.add_argument("--name", default="profile")
    p.add_argument("--fresh", action="store_true", help="ignore results of an earlier run")
    args = p.parse_args(argv)
    C.dispatch(args, {"worker": worker}, run)


if __name__ == "__main__":
    sys.exit(main())
