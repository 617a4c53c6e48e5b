"""Join MVs (`joins`: lookup joins with dimension tables): an MV kind of its own beside the
row MV's step loop, reached from `barrier.runner.run_barrier` through `run_barrier` here
(docs/JOINS.md, "How it runs"). barrier.py runs one barrier (snapshot mode); arrangement.py
one step of per-vnode positions (arrangement, no_shuffle) over it, chunks.py reading the
fact's chunks; sources.py reads both sides; store.py holds the state tables and the MV;
output.py turns joined rows into MV rows."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession

from backfill_assets.core.errors import JoinModeUnsupported
from backfill_assets.core.join_definition import tables_read
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.join import arrangement, barrier
from backfill_assets.join.sources import dimension_uri
from backfill_assets.join.store import recorded_pair
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.request import Hook, StepReport, no_hook

__all__ = ["barrier_due", "run_barrier", "tables_read", "watched_uris"]

MODES = ("snapshot", *arrangement.MODES)


def run_barrier(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
                *, version: int | None = None, controls: Controls, hook: Hook = no_hook
                ) -> StepReport:
    """One barrier of the join MV ``d``: the fact at ``version`` (latest when None), every
    dimension at its latest. It covers every fact vnode whatever ``vnodes`` a run names (a
    dimension change may reach a fact row in any vnode), so one barrier brings the whole MV
    to one version pair. In arrangement and no_shuffle modes a barrier is one step: the
    positions move by a chunk over every unfinished fact vnode (join/arrangement.py).
    Paused (rate limit 0): nothing runs. A mode no join serves is refused by name
    (`JoinModeUnsupported`)."""
    if d.mode not in MODES:
        raise JoinModeUnsupported(
            f"MV {d.name!r} joins {[j.table for j in d.joins]} in mode {d.mode!r}: join MVs "
            f"are built in one of {list(MODES)}; set mode: snapshot in the definition (or "
            "remove the mode key)")
    if controls.rate_limit == 0:
        return StepReport(version if version is not None else -1, tuple(vnodes), 0)
    if d.mode in arrangement.MODES:
        return arrangement.run(spark, d, tables, version, controls, hook)
    return barrier.run(spark, d, tables, version, controls, hook)


def barrier_due(d: MVDefinition, tables: MVTables) -> bool:
    """Whether either side moved past the version pair the MV's progress records (or no
    barrier ran yet): what a sensor asks of a join MV, whose upstreams are
    `tables_read(d)`; read from the tables' logs, nothing else."""
    pair = recorded_pair(d.name, tables, len(d.joins), d.vnode_count)
    if pair is None:
        return True
    so = tables.storage_options
    latest = [owned_tables.open_if_exists(u, so) for u in watched_uris(d, tables)]
    held = [pair.fact, *pair.dimensions]
    return any(t is not None and t.version() > v for t, v in zip(latest, held, strict=True))


def watched_uris(d: MVDefinition, tables: MVTables) -> tuple[str, ...]:
    """Where the tables of `tables_read(d)` live: the fact, then each dimension; a commit
    to any of them is work for the MV (what a follower waits on)."""
    return (tables.upstream, *(dimension_uri(tables, j.table) for j in d.joins))
