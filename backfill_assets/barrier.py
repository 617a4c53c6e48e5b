"""One barrier as the platform runs it: controls in force, the step, and progress figures.

Dagster assets, the demo and the benchmarks all call `run_barrier`; only the step does work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import SparkSession

from backfill_assets import mv_store
from backfill_assets.controls import Controls, read_controls
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv_store import MVTables
from backfill_assets.step import Hook, StepReport, StepRequest, no_hook, run_step


@dataclass(frozen=True)
class BarrierFigures:
    """Progress of the whole MV after a barrier (not only the run's vnodes)."""

    snapshot_rows_done: int
    upstream_rows: int
    vnodes_finished: int
    vnode_count: int
    rows_per_second: float  # this barrier's snapshot rows over its duration
    average_rows_per_second: float  # all snapshot rows so far over the backfill's age

    @property
    def percent_done(self) -> float:
        if self.vnodes_finished == self.vnode_count:
            return 100.0
        if self.upstream_rows <= 0:
            return 0.0
        return min(99.9, 100.0 * self.snapshot_rows_done / self.upstream_rows)

    @property
    def eta_seconds(self) -> float | None:
        remaining = max(0, self.upstream_rows - self.snapshot_rows_done)
        if self.vnodes_finished == self.vnode_count:
            return 0.0
        rate = self.average_rows_per_second
        return remaining / rate if rate > 0 else None


def run_barrier(spark: SparkSession, d: MVDefinition, tables: MVTables, vnodes: Sequence[int],
                *, version: int | None = None, overrides: Controls | None = None,
                hook: Hook = no_hook) -> StepReport:
    """Run one barrier for `vnodes` with the controls in force right now."""
    in_force = read_controls(mv_root(tables))
    overrides = overrides or Controls()
    chunk = overrides.chunk_size or in_force.chunk_size or d.chunk_size
    rate = _first_set(overrides.rate_limit, in_force.rate_limit, d.rate_limit)
    request = StepRequest(d, tables, tuple(vnodes), chunk, rate, version)
    if d.mode == "snapshot":  # a bulk read in slices, then catch-up (or the chunked path)
        from backfill_assets.snapshot_mode import run_snapshot_barrier

        return run_snapshot_barrier(spark, request, hook)
    return run_step(spark, request, hook)


def figures(d: MVDefinition, tables: MVTables, report: StepReport) -> BarrierFigures:
    """Percent done uses Delta file statistics of the upstream for the denominator."""
    progress_table = mv_store.open_table(tables.progress, tables.storage_options)
    rows = mv_store.read_rows(progress_table, None, ["backfill_finished", "row_count"])
    done = sum(r or 0 for r in rows["row_count"].to_pylist())
    finished = sum(1 for f in rows["backfill_finished"].to_pylist() if f)
    upstream = mv_store.open_table(tables.upstream, tables.storage_options, report.v_new)
    total = upstream.get_add_actions(flatten=True).column("num_records")
    upstream_rows = sum(n or 0 for n in total.to_pylist())
    rate = report.snapshot_rows / report.seconds if report.seconds > 0 else 0.0
    age = time.time() - json.loads(progress_table.metadata().description)["created_at"]
    return BarrierFigures(done, upstream_rows, finished, d.vnode_count, rate,
                          done / age if age > 0 else 0.0)


def mv_root(tables: MVTables) -> str:
    """The folder holding the MV's tables and its controls."""
    return tables.mv.rsplit("/", 1)[0]


def _first_set(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)
