"""Choose by cost: where applying a barrier's changes stops being cheaper than re-snapshotting
its vnodes (core/cost_choice.py, barrier/by_cost.py), measured with 1%, 10% and 30% of rows
changed in one barrier.

    make bench-crossover BENCH_CROSSOVER_ROWS=1000000
    .venv/bin/python -m benchmarks.bench_crossover --rows 1000000

In one fresh worker process under `flock $BENCH_LOCK`: backfill an N-row upstream (snapshot
mode, single pk, 256 vnodes) to completion, then for each fraction commit one DML batch of
fraction x N changes (the benchmarks' mix: inserts, updates, deletes, pk changes) from a
separate writer process and run the barrier that carries it three times, each on its own copy
of the MV's state (data files hard-linked): forced to apply the changes, forced to re-snapshot
the vnodes (the `barrier_choice` control as a run override) and by cost (`auto`); the order
rotates from one fraction to the next. The auto copy goes on to the next fraction, and the
forced runs' costs are folded into its measured unit costs, so at each fraction the model
knows what the MV measured before it, never the barrier it decides. With --check (default up
to 1M rows) the forced copies' MVs are compared row for row (Spark, both ways). Before the
first fraction a throwaway re-snapshot warms its Spark plan (its time: `cold_resnapshot_
seconds`). `--fractions 0.01 0.1 0.3 1.0` measures past the crossover too; the output projects
it from the largest fraction's forced runs either way.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from benchmarks import common as C

TRIALS = ("apply", "resnapshot", "auto")
FRACTIONS = (0.01, 0.1, 0.3)


def worker(args) -> dict:
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables

    info = C.prepare_upstream(args.rows, "single", args.vnodes)
    run_dir = os.path.join(C.WORK_DIR, f"crossover_{os.getpid()}")
    uri = C.work_copy(info["path"], os.path.join(run_dir, "upstream"))
    d = C.bench_mv("single", "snapshot", args.vnodes, 10_000, uri, name="bench_crossover")
    base = MVTables.under(os.path.join(run_dir, "base"), d.name, uri)
    spark, prof = _profiled_spark(uri)
    feeder = C.DmlFeeder(uri, "single", args.vnodes, next_id=args.rows, seed=11)
    audit, vnodes = C.CpuAudit(), list(range(args.vnodes))
    out: dict = {"rows": args.rows, "vnodes": args.vnodes, "mode": d.mode, "cases": []}
    try:
        t0 = time.perf_counter()
        while not run_barrier(spark, d, base, vnodes).finished:
            pass
        out["backfill_seconds"] = round(time.perf_counter() - t0, 2)
        print(f"  backfill of {args.rows:,} rows: {out['backfill_seconds']}s", flush=True)
        out["cold_resnapshot_seconds"] = _warm_resnapshot(spark, d, base, run_dir)
        for i, fraction in enumerate(args.fractions):
            changes = max(1, round(args.rows * fraction))
            dml = feeder.apply(changes)
            order = TRIALS[i % 3:] + TRIALS[:i % 3]
            trials = {t: _trial(spark, d, base, run_dir, t, dml["version"], vnodes, prof)
                      for t in order}
            case = _case(fraction, changes, dml, order, trials)
            if args.check:
                case["forced_paths_equal"] = _same_rows(spark, trials["apply"]["tables"],
                                                        trials["resnapshot"]["tables"])
            out["cases"].append(case)
            base = _next_base(trials, base)
        out["projected_crossover"] = projected_crossover(out["cases"][-1], args.rows)
        out.update(audit.result())
    finally:
        feeder.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _profiled_spark(uri: str):
    """The platform's session, warmed on the upstream, with a barrier's phases profiled."""
    prof = C.PhaseProfiler().install()
    spark, _ = C.start_spark()
    prof.jvm = C.java_pid()
    C.warm_read(spark, uri)
    return spark, prof


def _warm_resnapshot(spark, d, base, run_dir: str) -> float:
    """One re-snapshot of a throwaway copy before anything is measured: the first of a
    process pays the JIT of its Spark plan (1M rows: 11.2 s against 7.4-9.0 s after), which
    would fall on whichever trial ran it first. Returns its time."""
    from dataclasses import replace

    from backfill_assets import storage
    from backfill_assets.barrier.resnapshot import resnapshot_steps
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.step.modes.snapshot import SNAPSHOT
    from backfill_assets.step.request import StepRequest

    root = os.path.join(run_dir, "warm")
    C.work_copy(base.root, os.path.join(root, d.name))
    tables = MVTables.under(root, d.name, base.upstream)
    version = storage.latest_version(base.upstream)
    req = StepRequest(d, SNAPSHOT, tables, tuple(range(d.vnode_count)), d.chunk_size)
    t = time.perf_counter()
    resnapshot_steps(spark, replace(req, v_new=version))
    seconds = time.perf_counter() - t
    shutil.rmtree(root, ignore_errors=True)
    print(f"  a first re-snapshot (not measured): {seconds:.2f}s", flush=True)
    return round(seconds, 3)


def _trial(spark, d, base, run_dir: str, trial: str, version: int, vnodes: list[int],
           prof) -> dict:
    """One barrier at `version` on a copy of `base`'s state, with `barrier_choice` = `trial`."""
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.controls import Controls
    from backfill_assets.mv.owned_tables import MVTables

    root = os.path.join(run_dir, f"v{version}_{trial}")
    C.work_copy(base.root, os.path.join(root, d.name))
    tables = MVTables.under(root, d.name, base.upstream)
    choice = None if trial == "auto" else trial
    prof.reset()
    t = time.perf_counter()
    report = run_barrier(spark, d, tables, vnodes, version=version,
                         overrides=Controls(barrier_choice=choice))
    seconds = time.perf_counter() - t
    phases = C.rounded_phases(prof.reset())
    keep = ("barrier_choice", "barrier_choice_reason", "estimated_change_rows",
            "estimated_vnode_rows", "estimated_apply_seconds", "estimated_resnapshot_seconds",
            "apply_us_per_row", "resnapshot_us_per_row", "apply_cost_samples",
            "resnapshot_cost_samples", "catch_up_steps", "slices_done")
    print(f"  {trial}: {seconds:.2f}s ({report.extra.get('barrier_choice')}; "
          f"{report.forwarded_rows:,} forwarded, {report.snapshot_rows:,} re-read)", flush=True)
    return {"seconds": round(seconds, 3), "engine": report.engine,
            "forwarded_rows": report.forwarded_rows, "snapshot_rows": report.snapshot_rows,
            "resnapshot": report.extra.get("barrier_choice", "").startswith("re-snapshot"),
            "tables": tables, "phases": phases,
            **{k: report.extra[k] for k in keep if k in report.extra}}


def _case(fraction: float, changes: int, dml: dict, order, trials: dict) -> dict:
    apply, reread, auto = (trials[t]["seconds"] for t in TRIALS)
    faster = "resnapshot" if reread < apply else "apply"
    chose = "resnapshot" if trials["auto"]["resnapshot"] else "apply"
    case = {"fraction": fraction, "changes": changes, "version": dml["version"],
            "dml_seconds": round(dml["seconds"], 3), "order": list(order),
            "apply_seconds": apply, "resnapshot_seconds": reread, "auto_seconds": auto,
            "faster": faster, "auto_chose": chose, "auto_chose_faster": chose == faster,
            "trials": {t: {k: v for k, v in r.items() if k != "tables"}
                       for t, r in trials.items()}}
    print(f"  {fraction * 100:g}% ({changes:,} changes): apply {apply:.2f}s, re-snapshot "
          f"{reread:.2f}s, auto {auto:.2f}s (chose {chose}; faster: {faster})", flush=True)
    return case


def _next_base(trials: dict, old):
    """The auto copy goes on, knowing the forced runs' costs too (not twice the one it ran)."""
    from backfill_assets.mv.unit_costs import record_cost

    auto = trials["auto"]
    for path in ("apply", "resnapshot"):
        ran = trials[path]
        if path == ("resnapshot" if auto["resnapshot"] else "apply"):
            continue
        rows = ran.get("estimated_change_rows" if path == "apply" else "estimated_vnode_rows")
        if rows:
            record_cost(auto["tables"], path, int(rows), ran["seconds"])
    for t in ("apply", "resnapshot"):
        shutil.rmtree(os.path.dirname(trials[t]["tables"].root), ignore_errors=True)
    shutil.rmtree(os.path.dirname(old.root), ignore_errors=True)
    return auto["tables"]


def projected_crossover(case: dict, rows: int) -> dict:
    """The share of rows changed in one barrier at which both paths would cost the same, from
    the forced runs of `case` (the largest fraction): the model's affine costs with the unit
    costs those runs measured and the change rows per changed row their estimate saw."""
    from backfill_assets.core.cost_choice import APPLY_FIXED_SECONDS, RESNAPSHOT_FIXED_SECONDS

    apply, reread = case["trials"]["apply"], case["trials"]["resnapshot"]
    feed_rows = apply["estimated_change_rows"]
    per_apply = max(apply["seconds"] - APPLY_FIXED_SECONDS, 1e-9) / feed_rows
    per_reread = max(reread["seconds"] - RESNAPSHOT_FIXED_SECONDS, 1e-9) / \
        reread["estimated_vnode_rows"]
    per_change = feed_rows / case["changes"]  # change-feed rows per changed row
    at = (RESNAPSHOT_FIXED_SECONDS - APPLY_FIXED_SECONDS
          + per_reread * reread["estimated_vnode_rows"]) / (per_apply * per_change * rows)
    return {"from_fraction": case["fraction"], "apply_us_per_change_row": per_apply * 1e6,
            "resnapshot_us_per_vnode_row": per_reread * 1e6,
            "feed_rows_per_changed_row": per_change, "fraction": at}


def _same_rows(spark, a, b) -> bool:
    from backfill_assets import storage

    left, right = (storage.read_version(spark, t.mv, None) for t in (a, b))
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def run(args) -> dict:
    res: dict = {"machine": C.machine_info(), "args": vars(args)}
    common = ["--rows", str(args.rows), "--vnodes", str(args.vnodes)]
    C.run_worker("benchmarks.bench_bulk", ["worker-prepare", *common, "--pk", "single"])
    check = args.check if args.check is not None else args.rows <= 1_000_000
    extra = ["--fractions", *map(str, args.fractions)] + (["--check"] if check else [])
    res["run"] = C.run_clean("benchmarks.bench_crossover", ["worker", *common, *extra])
    path = C.save_results(f"crossover_{C.human_rows(args.rows)}", res)
    print_report(res)
    print_phases(res)
    print(f"\nresults: {path}")
    return res


def print_report(res: dict) -> None:
    r = res["run"]
    print(f"\nOne barrier over a finished {C.human_rows(r['rows'])}-row MV ({r['mode']} mode, "
          f"{r['vnodes']} vnodes): applying vs re-snapshotting (seconds)")
    rows = []
    for c in r["cases"]:
        auto = c["trials"]["auto"]
        rows.append([f"{c['fraction'] * 100:g}%", c["changes"], c["apply_seconds"],
                     c["resnapshot_seconds"], c["auto_seconds"], c["auto_chose"],
                     "yes" if c["auto_chose_faster"] else "no",
                     auto.get("estimated_apply_seconds", "-"),
                     auto.get("estimated_resnapshot_seconds", "-"),
                     c.get("forced_paths_equal", "-")])
    C.print_table(["changed", "changes", "apply s", "re-snapshot s", "auto s", "auto chose",
                   "the faster", "est. apply s", "est. re-snapshot s", "same rows"], rows)
    x = r["projected_crossover"]
    print(f"\nProjected crossover (the forced runs at {x['from_fraction'] * 100:g}%: "
          f"{x['apply_us_per_change_row']:.2f} us per change-feed row applied, "
          f"{x['resnapshot_us_per_vnode_row']:.2f} us per vnode row re-read, "
          f"{x['feed_rows_per_changed_row']:.2f} feed rows per changed row): re-snapshotting "
          f"costs less from {x['fraction'] * 100:.0f}% of rows changed in one barrier")
    print("\nMeasured per row (the forced runs): apply us per estimated change row, "
          "re-snapshot us per estimated vnode row")
    C.print_table(["changed", "apply us/row", "re-snapshot us/row"], [
        [f"{c['fraction'] * 100:g}%",
         _per_row(c["trials"]["apply"], "estimated_change_rows"),
         _per_row(c["trials"]["resnapshot"], "estimated_vnode_rows")] for c in r["cases"]])


def print_phases(res: dict) -> None:
    """Where each forced run's time went (wall / driver CPU / JVM CPU), phases of 0.05 s on."""
    print("\nPhases of the forced runs (wall / driver CPU / JVM CPU seconds)")
    for c in res["run"]["cases"]:
        for t in ("apply", "resnapshot"):
            trial = c["trials"][t]
            print(f"-- {c['fraction'] * 100:g}% {t} ({trial['seconds']:.2f}s)")
            C.print_table(["phase", "wall s", "driver cpu s", "jvm cpu s"],
                          [[k, *v] for k, v in trial["phases"].items() if v[0] >= 0.05])


def _per_row(trial: dict, key: str) -> str:
    rows = trial.get(key)
    return f"{trial['seconds'] * 1e6 / rows:.2f}" if rows else "-"


def _options(parser: argparse.ArgumentParser) -> None:
    """What the driver and its worker both take."""
    parser.add_argument("--rows", type=int, default=5_000_000,
                        help="rows of the finished MV's upstream (1000000: a quick check)")
    parser.add_argument("--vnodes", type=int, default=256)
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS),
                        help="shares of the rows changed in one barrier")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _options(p)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                   help="compare the forced runs' MVs row for row (default: up to 1M rows)")
    inner = p.add_subparsers(dest="cmd").add_parser("worker")
    _options(inner)
    inner.add_argument("--check", action="store_true")
    C.dispatch(p.parse_args(argv), {"worker": worker}, run)


if __name__ == "__main__":
    sys.exit(main())
