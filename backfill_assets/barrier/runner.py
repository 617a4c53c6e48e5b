"""One barrier as the platform runs it: controls in force, the path it takes, and figures.

Dagster assets, the demo and the benchmarks all call `run_barrier`; only the step does work.
The figures are read back from the tables (progress rows, Delta commit times), so every run
reports the whole MV, whichever vnode range it covered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from backfill_assets import aggregate, join
from backfill_assets.barrier.by_cost import by_cost
from backfill_assets.barrier.pacing import paced
from backfill_assets.core import codec
from backfill_assets.core.figures import MVFigures, RateSample, recent_rate
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.controls import Controls, read_controls
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.reset import nothing_left_on_refusal
from backfill_assets.step import heap
from backfill_assets.step.modes import mode_named
from backfill_assets.step.request import Hook, StepReport, StepRequest, no_hook

RATE_WINDOW_COMMITS = 6  # progress commits the rows/s figure (and so the ETA) looks back over
LAG_HISTORY_LIMIT = 1000  # upstream commits read back at most to date the lag


def controls_in_force(d: MVDefinition, tables: MVTables,
                      overrides: Controls | None = None) -> Controls:
    """What the next barrier will use: run overrides, else the stored controls, else the MV
    definition's; `chunk_size` is always set, `rate_limit` None means unlimited,
    `barrier_choice` None means by cost."""
    stored = read_controls(tables)
    overrides = overrides or Controls()
    chunk = overrides.chunk_size or stored.chunk_size or d.chunk_size
    rate = _first_set(overrides.rate_limit, stored.rate_limit, d.rate_limit)
    return Controls(chunk, rate, overrides.barrier_choice or stored.barrier_choice)


def run_barrier(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
                *, version: int | None = None, overrides: Controls | None = None,
                hook: Hook = no_hook, pace_seconds: float = 0.0) -> StepReport:
    """Run one barrier for `vnodes` with the controls in force right now; a refusal (a named
    error) leaves none of the MV's state that the barrier would have created. Under a rate
    limit the barrier steps at that rate for `pace_seconds` (0: one step; a Dagster run gives
    `pacing.BARRIER_SECONDS`; barrier/pacing.py); otherwise a barrier over finished vnodes
    applies its changes or re-reads them, whichever costs less (barrier/by_cost.py). A
    process's first long barrier as it ends, or else its second join or aggregate barrier as
    it starts, moves the heap out of the cyclic collector's reach (step/heap.py; a row MV's
    step loop does it per step)."""
    started = time.monotonic()
    with nothing_left_on_refusal(tables):
        report = _run(spark, d, tables, vnodes, version, controls_in_force(d, tables, overrides),
                      hook, pace_seconds)
    heap.step_ended(time.monotonic() - started)
    return report


def _run(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
         version: int | None, controls: Controls, hook: Hook, pace_seconds: float
         ) -> StepReport:
    """The barrier by the MV's kind: a join, an aggregate, or a row MV's steps."""
    if d.joins or d.is_aggregate:
        heap.step_starting()
    if d.joins:  # an MV kind of its own (backfill_assets/join/)
        return join.run_barrier(spark, d, tables, vnodes, version=version,
                                controls=controls, hook=hook)
    if d.is_aggregate:  # an MV kind of its own (backfill_assets/aggregate/)
        return aggregate.run_barrier(spark, d, tables, vnodes, version=version,
                                     controls=controls, hook=hook)
    request = StepRequest(d, mode_named(d.mode), tables, tuple(vnodes),
                          controls.chunk_size, controls.rate_limit, version)
    if controls.rate_limit:
        return paced(spark, request, hook, pace_seconds)
    return by_cost(spark, request, hook, controls.barrier_choice)


def watched_uris(d: MVDefinition, tables: MVTables) -> tuple[str, ...]:
    """The tables whose commits are work for ``d``, its upstream first: a join MV's
    dimensions too (`join.watched_uris`), so a commit on either side reaches the MV."""
    return join.watched_uris(d, tables) if d.joins else (tables.upstream,)


def figures(d: MVDefinition, tables: MVTables, controls: Controls,
            version: int | None = None) -> MVFigures | None:
    """Percent done (upstream rows at `version`, default latest, from Delta file statistics),
    rows/s over the last progress commits (wall clock), ETA, and lag behind the upstream's
    latest version; None before the first barrier."""
    so = tables.storage_options
    progress = owned_tables.open_if_exists(tables.progress, so)
    if progress is None:
        return None
    rows = owned_tables.read_rows(progress, None, [codec.FINISHED, codec.ROW_COUNT, codec.VERSION])
    finished = sum(1 for f in rows[codec.FINISHED].to_pylist() if f)
    versions = [v for v in rows[codec.VERSION].to_pylist() if v is not None]
    upstream = owned_tables.open_if_exists(tables.upstream, so)
    # the latest version is counted from the table kept open (brought forward by its new
    # commits); an older one is loaded, a replay of the upstream's whole log
    counted = upstream if version in (None, upstream.version()) else \
        owned_tables.open_if_exists(tables.upstream, so, version)
    upstream_rows = sum(n or 0 for n in
                        counted.get_add_actions(flatten=True).column("num_records").to_pylist())
    mv_version = min(versions) if versions else None
    return MVFigures(
        snapshot_rows_done=_rows_done(rows), upstream_rows=upstream_rows,
        vnode_count=d.vnode_count, vnodes_finished=finished, vnodes_started=rows.num_rows,
        paused=controls.rate_limit == 0,
        rows_per_second=recent_rate(_rate_samples(progress, tables)),
        upstream_version=upstream.version(), mv_version=mv_version,
        lag_seconds=_lag_seconds(upstream, mv_version))


def _rows_done(rows) -> int:
    return sum(r or 0 for r in rows[codec.ROW_COUNT].to_pylist())


def _rate_samples(progress, tables: MVTables) -> list[RateSample]:
    """Snapshot rows done at the newest and at the oldest of the last progress commits."""
    history = progress.history(RATE_WINDOW_COMMITS)
    if len(history) < 2:
        return []
    samples = []
    for commit in (history[0], history[-1]):
        table = owned_tables.open_if_exists(tables.progress, tables.storage_options,
                                            commit["version"])
        rows = owned_tables.read_rows(table, None, [codec.ROW_COUNT])
        samples.append(RateSample(commit["timestamp"] / 1000.0, _rows_done(rows)))
    return samples


def _lag_seconds(upstream, mv_version: int | None) -> float:
    """Age of the first upstream commit after `mv_version` (0 when the MV is caught up)."""
    if mv_version is None or upstream.version() <= mv_version:
        return 0.0
    behind = upstream.history(min(LAG_HISTORY_LIMIT, upstream.version() - mv_version))
    stamps = [h["timestamp"] for h in behind if h.get("timestamp") is not None]
    if not stamps:  # no commit time recorded or kept (delta-rs' history of such a log)
        return 0.0
    return max(0.0, time.time() - stamps[-1] / 1000.0)


def _first_set(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)
