"""Continuous mode on the aggregate MV (benchmarks/agg_platform.py): the follower's own loop
(`barrier.follower.follow`, what `follower_job` runs, here in the worker process on its warm
session rather than under `dagster dev`) while a writer process commits one DML batch of the
shared sequence every --interval seconds. Commit-to-MV per commit: from the upstream commit's
timestamp (its commitInfo) to the moment the follower reports the first barrier whose version
covers it (after the MV's commit and the follower's own figures: slightly late, never early)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from benchmarks import agg_data as A
from benchmarks import common as C


def _writer(conn, uri: str, vnodes: int, stream: A.ChangeStream, commits: int,
            changes: int, interval: float) -> None:
    from backfill_assets.upstream.writer.dml import apply_dml

    spec = A.orders_spec(vnodes)
    versions, next_at = [], time.monotonic() + interval
    for _ in range(commits):
        time.sleep(max(0.0, next_at - time.monotonic()))
        batch, _ = stream.batch(changes)
        versions.append(apply_dml(uri, batch, spec=spec))
        next_at += interval
    conn.send(versions)


def continuous(spark, d, tables, vnodes, stream: A.ChangeStream, args) -> dict:
    """The follower over the finished MV while the writer commits; latencies per commit."""
    from deltalake import DeltaTable

    from backfill_assets.barrier.follower import follow

    done: list[tuple[int, float]] = []  # (version the barrier brought the MV to, when)
    took: list[float] = []  # each barrier's own seconds (its report)
    stop = threading.Event()

    def on_barrier(record) -> None:
        done.append((record.report.v_new, time.time()))
        took.append(round(record.report.seconds, 3))

    loop = threading.Thread(target=follow, args=(spark, d, tables, vnodes), daemon=True,
                            kwargs={"on_barrier": on_barrier, "stop": stop,
                                    "log": lambda _m: None})
    loop.start()
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    writer = ctx.Process(target=_writer, daemon=True, args=(
        child, tables.upstream, args.vnodes, stream, args.commits, args.commit_changes,
        args.interval))
    audit = C.CpuAudit()
    writer.start()
    versions = conn.recv()
    writer.join(30)
    end = time.monotonic() + 60
    while time.monotonic() < end and not (done and done[-1][0] >= versions[-1]):
        time.sleep(0.05)
    stop.set()
    loop.join(60)
    committed = {int(h["version"]): h["timestamp"] / 1000.0
                 for h in DeltaTable(tables.upstream).history(len(versions) + 5)}
    latencies, missed = [], []
    for v in versions:
        first = next((t for got, t in done if got >= v), None)
        if first is None:
            missed.append(v)
        else:
            latencies.append(round(first - committed[v], 3))
    return {"commits": len(versions), "interval": args.interval,
            "changes_per_commit": args.commit_changes, "barriers": len(done),
            "missed": missed, "latencies": latencies, "barrier_seconds": took,
            **C.summary(latencies), **audit.result()}
