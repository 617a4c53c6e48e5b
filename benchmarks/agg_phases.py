"""Where an aggregate barrier's wall time goes, per phase, without cProfile's overhead (which
inflates the Python-level parts several times): the functions of the barrier's path wrapped
in timers, the bulk barrier, then ``--rounds`` rounds of one barrier after each batch of
``--changes`` changes (benchmarks/agg_data.py's DML), each barrier's total and phases printed,
and the final MV against Spark's GROUP BY:

    flock /tmp/spark.lock .venv/bin/python -m benchmarks.agg_phases --rows 2000000 \\
        --changes 2000 20000 --rounds 4

The phases nest (``_commit`` holds the tables' ``write``s, each an ``apply_keyed``), and the
threads of the concurrent commits add up, so phases are not a partition of the total.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import shutil
import statistics
import time

from benchmarks import agg_data as A
from benchmarks import agg_runs as R
from benchmarks import common as C

_SPENT: dict[str, float] = collections.defaultdict(float)


def _timed(owner: object, name: str) -> None:
    inner = getattr(owner, name, None)
    if inner is None:  # a name the measured commit does not have (an older frozen copy)
        return

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _SPENT[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def _gc_timer() -> None:
    """The garbage collector's pauses as a phase (`gc`, and `gc2` for full collections): a
    pause lands in whichever phase allocates when it triggers."""
    started: list[float] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            spent = time.perf_counter() - started.pop()
            _SPENT["gc"] += spent
            if info.get("generation") == 2:
                _SPENT["gc2"] += spent

    gc.callbacks.append(callback)


def _wrap() -> None:
    from backfill_assets import storage
    from backfill_assets.aggregate import barrier as B
    from backfill_assets.aggregate import checkpoint as K
    from backfill_assets.aggregate import store as S
    from backfill_assets.arrow import aggregate_state as AS
    from backfill_assets.mv import recovery
    from backfill_assets.storage.rows import commit as CM
    from backfill_assets.storage.writes import merge as M

    commit_later = getattr(B.owned_tables, "commit_later", None)

    for owner, names in [
        (B, ["open_barrier", "signed_rows", "group_texts", "group_vnodes", "write_progress",
             "settle", "compact_later", "run", "distinct_groups", "apply_signed"]),
        (K, ["keyed_state"]), (K.Ahead, ["touched", "advanced", "changed"]),
        (B._Barrier, ["progress_version", "txns", "_choice", "netted", "_replay", "_commit",
                      "_apply", "_write"]),
        (S.AggregateStore, ["read", "write"]), (K, ["state_step"]),
        (AS.AggregateTables, ["state_update", "mv_rows"]),
        (B.netting, ["net_with_prior"]), (storage, ["read_raw_changes", "apply_keyed"]),
        (M.keyed, ["locate", "write_located", "write_located_feed"]), (M, ["commit"]),
        (CM, ["_entry", "_maybe_checkpoint"]), (CM.objects, ["put_if_absent"]),
        (S.held, ["committed"]), (S.AggregateStore, ["snapshot", "txn_version", "ensure"]),
        (B, ["check_change_keys", "checked_upstream", "projection_of", "read_progress"]),
        (B.owned_tables, ["ensure_table", "overwrite_vnodes", "open_if_exists", "replace_keyed"]),
        (B.storage, ["read_json"]), (CM.DeltaTable, ["create_checkpoint"]),
        (recovery, ["write_progress"]), (getattr(B, "Feed", None), ["netted"]),
        (commit_later, ["_wait"])]:
        for name in names:
            _timed(owner, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    R.add_worker_args(parser)
    parser.add_argument("--changes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--checkpoint-interval", type=int, default=None,
                        help="Delta checkpoints every N versions of each table the barrier "
                             "commits to (storage/rows/commit.py's interval) instead of the "
                             "code's own: how much a checkpoint costs a barrier")
    args = parser.parse_args()
    from backfill_assets.barrier.runner import run_barrier
    from backfill_assets.mv.owned_tables import MVTables
    from backfill_assets.upstream.writer.dml import apply_dml

    _wrap()
    _gc_timer()
    if args.checkpoint_interval:
        from backfill_assets.storage.rows import commit

        commit.CHECKPOINT_INTERVAL = args.checkpoint_interval
    run_dir, uri, info = R.private_upstream(args, "phases")
    d = A.definition(uri, args.vnodes)
    tables = MVTables.under(run_dir, d.name, uri)
    vnodes = list(range(args.vnodes))
    spark, _ = C.start_spark()
    try:
        run_barrier(spark, d, tables, vnodes)
        stream, spec = A.ChangeStream(args.rows, info["days"]), A.orders_spec(args.vnodes)
        runs: dict[int, list] = collections.defaultdict(list)
        for _ in range(args.rounds):
            for n in args.changes:
                apply_dml(uri, stream.batch(n)[0], spec=spec)
                _SPENT.clear()
                t0 = time.perf_counter()
                report = run_barrier(spark, d, tables, vnodes)
                runs[n].append((time.perf_counter() - t0, dict(_SPENT), report.extra))
        for n, done in runs.items():
            totals = [round(t, 3) for t, _, _ in done]
            print(f"== {n} changes: {totals}, median {statistics.median(totals):.3f}s")
            print("   state checkpoint:", [e.get("state_checkpoint") for _, _, e in done])
            print("   compacting:", [e.get("compacting") for _, _, e in done])
            names = sorted({k for _, p, _ in done for k in p},
                           key=lambda k: -statistics.median(p.get(k, 0) for _, p, _ in done))
            for name in names:
                print(f"   {name:18s} " + " ".join(f"{p.get(name, 0):.3f}" for _, p, _ in done))
        print(R.mismatches(spark, spark.read.format("delta").load(tables.mv), uri))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
