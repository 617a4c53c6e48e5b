"""What people watch: per-vnode and per-barrier progress as Dagster metadata values.

The MV-wide figures and a table with one row per vnode go into ONE summary event per barrier
(wiring/events.py: the asset's Overview shows it, its Plots tab draws the figures over
barriers); the per-vnode events that set partition statuses carry two facts each.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from backfill_assets.core.figures import (
    FINISHED,
    IN_PROGRESS,
    NOT_STARTED,
    MVFigures,
    state_ranges,
)
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.core.read_cost import ReadCost
from backfill_assets.mv.controls import Controls
from backfill_assets.step.request import StepReport


def vnode_table(report: StepReport, vnodes: Sequence[int], upstream_version: int
                ) -> dg.TableMetadataValue:
    """One row per vnode of the barrier (state, current_pos, row_count, version, lag): the
    per-vnode detail of a barrier in one event (a not-started vnode has no position)."""
    rows = []
    for vnode in vnodes:
        p = report.progress[vnode]
        version = report.versions[vnode]
        rows.append(dg.TableRecord({
            "vnode": vnode,
            "state": FINISHED if isinstance(p, Completed) else
            IN_PROGRESS if isinstance(p, InProgress) else NOT_STARTED,
            "current_pos": _pos(p.current_pos if isinstance(p, (InProgress, Completed))
                                else None),
            "row_count": getattr(p, "row_count", 0),
            "version": version,
            "lag_versions": max(0, upstream_version - version)}))
    return dg.MetadataValue.table(rows, schema=VNODE_TABLE)


VNODE_TABLE = dg.TableSchema(columns=[
    dg.TableColumn("vnode", "int"), dg.TableColumn("state", "string"),
    dg.TableColumn("current_pos", "string", description="last key read (pk values)"),
    dg.TableColumn("row_count", "int", description="snapshot rows read"),
    dg.TableColumn("version", "int", description="upstream version the vnode is at"),
    dg.TableColumn("lag_versions", "int")])


def controls_metadata(controls: Controls) -> dict:
    """The controls a barrier runs with (rate None = unlimited, 0 = paused)."""
    rate = controls.rate_limit
    return {
        "controls_rate_limit": dg.MetadataValue.text(
            "unlimited" if rate is None else "0 (paused)" if rate == 0 else f"{rate} rows/s"),
        "controls_chunk_size": dg.MetadataValue.int(controls.chunk_size or 0),
        "paused": dg.MetadataValue.bool(rate == 0),
        "controls_barrier_choice": dg.MetadataValue.text(controls.barrier_choice or "auto"),
    }


def figures_metadata(figures: MVFigures, controls: Controls, states: dict[int, str]) -> dict:
    """The whole MV: state, percent done, rows/s, ETA, lag, vnode states, controls."""
    eta = figures.eta_seconds
    lag = figures.lag_versions
    meta = {
        "state": dg.MetadataValue.text(figures.state),
        "percent_done": dg.MetadataValue.float(round(figures.percent_done, 2)),
        "vnodes_finished": dg.MetadataValue.int(figures.vnodes_finished),
        "vnodes_in_progress": dg.MetadataValue.int(
            figures.vnodes_started - figures.vnodes_finished),
        "vnodes_not_started": dg.MetadataValue.int(figures.vnode_count - figures.vnodes_started),
        "vnode_states": dg.MetadataValue.text(state_ranges(states, figures.vnode_count)),
        "rows_per_second": dg.MetadataValue.float(round(figures.rows_per_second, 1)),
        "eta": dg.MetadataValue.text(
            "paused" if figures.paused and eta is None else
            "unknown yet" if eta is None else f"{eta:.0f} s"),
        "lag_versions": dg.MetadataValue.int(lag if lag is not None else 0),
        "lag_seconds": dg.MetadataValue.float(round(figures.lag_seconds, 1)),
        "upstream_version": dg.MetadataValue.int(figures.upstream_version),
        "snapshot_rows_done": dg.MetadataValue.int(figures.snapshot_rows_done),
        "upstream_rows": dg.MetadataValue.int(figures.upstream_rows),
        **controls_metadata(controls),
    }
    if eta is not None:  # a number only when there is one: plots skip the paused barriers
        meta["eta_seconds"] = dg.MetadataValue.float(round(eta, 1))
    return meta


def barrier_metadata(report: StepReport, figures: MVFigures, controls: Controls,
                     states: dict[int, str]) -> dict:
    """The whole MV after a barrier plus what the barrier itself did."""
    return {
        **figures_metadata(figures, controls, states),
        "barrier_version": dg.MetadataValue.int(report.v_new),
        "vnodes": dg.MetadataValue.text(f"{report.vnodes[0]}..{report.vnodes[-1]}"),
        "rows_read_from_snapshot": dg.MetadataValue.int(report.snapshot_rows),
        "rows_forwarded_from_change_feed": dg.MetadataValue.int(report.forwarded_rows),
        "barrier_engine": dg.MetadataValue.text(report.engine),
        "rows_replicated": dg.MetadataValue.int(report.replicated_rows),
        "chunk_limit": dg.MetadataValue.int(report.chunk_limit),
        "recovered_vnodes": dg.MetadataValue.int(len(report.recovered)),
        "step_seconds": dg.MetadataValue.float(round(report.seconds, 3)),
        **{k: _value(v) for k, v in report.extra.items()},  # e.g. snapshot mode's slices
    }


def read_cost(report: StepReport, figures: MVFigures, seeks_upstream: bool) -> ReadCost | None:
    """The barrier's snapshot read against its chunk (None: it read no files by a seek), with
    its figure added to the barrier's metadata and, when the upstream's layout bounds it, the
    statement of that bound (``read_bound_by_layout``). ``seeks_upstream``: what the MV's mode
    declares (``Mode.seeks_upstream``)."""
    scanned = report.extra.get("snapshot_rows_scanned")
    if scanned is None:
        return None
    cost = ReadCost(seeks_upstream, report.snapshot_rows, int(scanned),
                    max(0, figures.upstream_rows - figures.snapshot_rows_done),
                    report.chunk_limit, figures.upstream_rows,
                    int(report.extra.get("snapshot_window_rows", 0)))
    report.extra["snapshot_read_amplification"] = round(cost.amplification, 1)
    if cost.layout_bound:
        report.extra["read_bound_by_layout"] = cost.statement()
    return cost


def _value(v: object) -> dg.MetadataValue:
    if isinstance(v, bool):
        return dg.MetadataValue.bool(v)
    if isinstance(v, int):
        return dg.MetadataValue.int(v)
    if isinstance(v, float):
        return dg.MetadataValue.float(v)
    text = str(v)
    return dg.MetadataValue.md(text) if text.startswith("|") else dg.MetadataValue.text(text)


def _pos(pos) -> str:
    if pos is None or all(v is None for v in pos):
        return "-"
    return ", ".join(str(v) for v in pos)
