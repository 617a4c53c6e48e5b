"""The contenders of the join benchmark (benchmarks/bench_join.py), each in its own process on
private copies of the same cached tables, following the same plan: the full computation, then
fact batches (a refresh after each), then dimension batches (a refresh after each); the final
MV compared with Spark's own recompute of the final tables.

- sdp: Spark Declarative Pipelines' `@dp.materialized_view(format="delta")` of the query
  (benchmarks/agg_sdp.py's project and run). Its Delta refresh fails on this Spark and Delta
  (DELTA_CANNOT_CHANGE_PROVIDER, docs/BENCHMARKS.md's aggregate section), so a refresh is
  measured as it would run once that passed: the MV dropped and the pipeline run again.
- overwrite: delta-spark, the join + GROUP BY of both tables overwriting the MV.
- platform: `run_barrier` on the join MV definition (docs/JOINS.md).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import agg_sdp as S
from benchmarks import common as C
from benchmarks import join_data as J


def add_worker_args(parser) -> None:
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--customers", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--vnodes", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--dim-changes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)


def worker_prepare(args) -> dict:
    return J.prepare(args.rows, args.customers, args.groups, args.vnodes)


def _private(args, label: str) -> tuple[str, dict, dict]:
    info = J.prepare(args.rows, args.customers, args.groups, args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"join_{label}_{os.getpid()}")
    paths = {t: C.work_copy(info[t], os.path.join(run_dir, t)) for t in ("orders", "customers")}
    return run_dir, paths, info


def follow_plan(args, paths: dict, info: dict, refresh: Callable[[], dict]) -> list[dict]:
    """The plan's batches applied in order (facts, then the dimension), `refresh()` after
    each; per phase the runs and their median."""
    from backfill_assets.upstream.writer.dml import apply_dml

    specs = dict(zip(("orders", "customers"), J.specs(args.vnodes), strict=True))
    stream = J.Changes(args.rows, args.customers, info["days"])
    plan = [("facts", "orders", max(1, round(args.rows * args.fraction)))] * args.repeat
    plan += [("dimension", "customers", args.dim_changes)] * args.repeat
    cases: dict[str, dict] = {}
    for phase, table, n in plan:
        batch, counts = stream.facts(n) if phase == "facts" else stream.dimension(n)
        t0 = time.perf_counter()
        version = apply_dml(paths[table], batch, spec=specs[table])
        dml_s = time.perf_counter() - t0
        run = refresh()
        run.update(version=version, changes=n, kinds=counts, dml_seconds=round(dml_s, 3))
        case = cases.setdefault(phase, {"phase": phase, "changes": n, "runs": []})
        case["runs"].append(run)
        print(f"    {phase} ({n:,} changes, version {version}): {run['seconds']:.3f}s",
              flush=True)
    for case in cases.values():
        case["median_seconds"] = round(statistics.median(r["seconds"] for r in case["runs"]), 3)
    return list(cases.values())


def timed(fn: Callable[[], object]) -> dict:
    t0 = time.perf_counter()
    fn()
    return {"seconds": round(time.perf_counter() - t0, 3)}


def recompute(spark, paths: dict):
    """Spark's own join + GROUP BY of both tables' latest versions: the recompute and the
    oracle."""
    return spark.sql(J.sql(paths["orders"], paths["customers"]))


def mismatches(spark, mv, paths: dict) -> dict:
    """Rows of the MV not in the recompute and rows of the recompute not in the MV (every
    output column compared exactly), and the MV's group count."""
    mv = mv.select(*J.OUTPUT)
    oracle = recompute(spark, paths).select(*J.OUTPUT)
    return {"groups": mv.count(), "oracle_groups": oracle.count(),
            "mv_not_in_oracle": mv.exceptAll(oracle).count(),
            "oracle_not_in_mv": oracle.exceptAll(mv).count()}


def worker_overwrite(args) -> dict:
    from benchmarks import delta_spark as DS

    run_dir, paths, info = _private(args, "overwrite")
    spark = DS.user_session(C.start_spark()[0])
    C.warm_read(spark, paths["orders"])
    mv = os.path.join(run_dir, "mv")

    def overwrite(out: str) -> None:
        (recompute(spark, paths).write.format("delta").mode("overwrite")
         .option("overwriteSchema", "true").save(out))

    try:
        overwrite(os.path.join(run_dir, "warm"))  # JIT and Delta's write classes
        out: dict = {"contender": "overwrite", "rows": args.rows,
                     "full": timed(lambda: overwrite(mv))}
        print(f"    full join + GROUP BY + overwrite: {out['full']['seconds']:.2f}s", flush=True)
        out["cases"] = follow_plan(args, paths, info, lambda: timed(lambda: overwrite(mv)))
        out["check"] = mismatches(spark, spark.read.format("delta").load(mv), paths)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _sdp_project(folder: str, paths: dict, name: str = J.MV_NAME, delta: bool = True,
                 where: str = "") -> Path:
    """A pipeline project whose one MV ``name`` is the join's query (a warm-up one under
    another name: one catalog holds both)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "transformations"))
    query = J.sql(paths["orders"], paths["customers"]) + where
    with open(os.path.join(folder, "transformations", f"{name}.py"), "w",
              encoding="utf-8") as f:
        f.write(S.DEFINITION.format(name=name, sql=query,
                                    format=', format="delta"' if delta else ""))
    spec = os.path.join(folder, "spark-pipeline.yml")
    with open(spec, "w", encoding="utf-8") as f:
        f.write(S.SPEC.format(name=name, storage=os.path.join(folder, "storage")))
    return Path(spec)


def worker_sdp(args) -> dict:
    from tests.infra.spark_servers import start_connect_server

    run_dir, paths, info = _private(args, "sdp")
    warehouse = os.path.join(run_dir, "warehouse")
    os.makedirs(os.path.join(run_dir, "server"))
    server = start_connect_server(os.path.join(run_dir, "server"), master="local[*]", conf={
        "spark.sql.warehouse.dir": warehouse, "spark.driver.memory": "2g"})
    os.environ["SPARK_REMOTE"] = server.remote_url
    try:
        warm = _sdp_project(os.path.join(run_dir, "warm"), paths, "warm_mv", False,
                            " HAVING day < DATE'2020-02-01'")
        for _ in range(2):  # the server's JIT, Delta's classes, the pipeline machinery
            S.run_pipeline(warm)
        spec = _sdp_project(os.path.join(run_dir, "pipeline"), paths)
        out: dict = {"contender": "sdp", "rows": args.rows, "full": S.run_pipeline(spec)}
        print(f"    SDP full computation: {out['full']['seconds']:.2f}s", flush=True)

        def refresh() -> dict:
            t0 = time.perf_counter()
            with S._session() as spark:
                spark.sql(f"DROP TABLE IF EXISTS {J.MV_NAME}")
            return {"seconds": round(S.run_pipeline(spec)["seconds"]
                                     + time.perf_counter() - t0, 3)}

        out["cases"] = follow_plan(args, paths, info, refresh)
        with S._session() as spark:
            out["check"] = mismatches(spark, spark.read.table(J.MV_NAME), paths)
    finally:
        os.environ.pop("SPARK_REMOTE", None)
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def worker_platform(args) -> dict:
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables

    run_dir, paths, info = _private(args, "platform")
    d = J.definition(paths["orders"], paths["customers"], args.vnodes)
    tables = MVTables.under(run_dir, d.name, paths["orders"])
    vnodes = list(range(args.vnodes))
    spark, _ = C.start_spark()
    C.warm_read(spark, paths["orders"])

    def barrier() -> dict:
        t0 = time.perf_counter()
        report = run_barrier(spark, d, tables, vnodes)
        return {"seconds": round(time.perf_counter() - t0, 3), "finished": report.finished,
                "engine": str(report.engine), "report": dict(report.extra or {})}

    try:
        out: dict = {"contender": "platform", "rows": args.rows, "full": barrier()}
        print(f"    platform bulk backfill: {out['full']['seconds']:.2f}s", flush=True)
        out["idle"] = barrier()
        out["cases"] = follow_plan(args, paths, info, barrier)
        out["state_bytes"] = {p: C.dir_bytes(os.path.join(tables.join_state, p))
                              for p in os.listdir(tables.join_state)}
        out["check"] = mismatches(spark, spark.read.format("delta").load(tables.mv), paths)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out
