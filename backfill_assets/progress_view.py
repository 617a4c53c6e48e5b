"""What people watch: per-vnode and per-run progress as Dagster metadata values."""

from __future__ import annotations

import dagster as dg

from backfill_assets.barrier import BarrierFigures
from backfill_assets.core.progress import Completed, InProgress
from backfill_assets.step import StepReport


def vnode_metadata(report: StepReport, vnode: int) -> dict:
    """current_pos, row_count, finished and version of one vnode partition."""
    p = report.progress[vnode]
    pos = p.current_pos if isinstance(p, (InProgress, Completed)) else None
    return {
        "current_pos": dg.MetadataValue.text(_pos(pos)),
        "row_count": dg.MetadataValue.int(p.row_count),
        "finished": dg.MetadataValue.bool(isinstance(p, Completed)),
        "version": dg.MetadataValue.int(report.versions[vnode]),
    }


def run_metadata(report: StepReport, figures: BarrierFigures) -> dict:
    """Per-run figures plus a compact table of all the run's vnodes."""
    eta = figures.eta_seconds
    return {
        "barrier_version": dg.MetadataValue.int(report.v_new),
        "vnodes": dg.MetadataValue.text(f"{report.vnodes[0]}..{report.vnodes[-1]}"),
        "rows_read_from_snapshot": dg.MetadataValue.int(report.snapshot_rows),
        "rows_forwarded_from_change_feed": dg.MetadataValue.int(report.forwarded_rows),
        "rows_replicated": dg.MetadataValue.int(report.replicated_rows),
        "chunk_limit": dg.MetadataValue.int(report.chunk_limit),
        "paused": dg.MetadataValue.bool(report.paused),
        "recovered_vnodes": dg.MetadataValue.int(len(report.recovered)),
        "percent_done": dg.MetadataValue.float(round(figures.percent_done, 2)),
        "vnodes_finished": dg.MetadataValue.text(
            f"{figures.vnodes_finished}/{figures.vnode_count}"),
        "rows_per_second": dg.MetadataValue.float(round(figures.rows_per_second, 1)),
        "rows_per_second_since_start": dg.MetadataValue.float(
            round(figures.average_rows_per_second, 1)),
        "eta_seconds": dg.MetadataValue.float(round(eta, 1) if eta is not None else -1.0),
        "step_seconds": dg.MetadataValue.float(round(report.seconds, 3)),
        "vnode_progress": dg.MetadataValue.md(progress_table(report)),
        **{k: _value(v) for k, v in report.extra.items()},  # e.g. snapshot mode's slices
    }


def _value(v: object) -> dg.MetadataValue:
    if isinstance(v, bool):
        return dg.MetadataValue.bool(v)
    if isinstance(v, int):
        return dg.MetadataValue.int(v)
    if isinstance(v, float):
        return dg.MetadataValue.float(v)
    text = str(v)
    return dg.MetadataValue.md(text) if text.startswith("|") else dg.MetadataValue.text(text)


def progress_table(report: StepReport) -> str:
    """All of the run's vnodes at a glance: one Markdown row each."""
    lines = ["| vnode | state | current_pos | rows | version |", "|---|---|---|---|---|"]
    for vnode in report.vnodes:
        p = report.progress[vnode]
        state = type(p).__name__
        pos = p.current_pos if isinstance(p, (InProgress, Completed)) else None
        lines.append(f"| {vnode} | {state} | {_pos(pos)} | {p.row_count} | "
                     f"{report.versions[vnode]} |")
    return "\n".join(lines)


def _pos(pos) -> str:
    if pos is None or all(v is None for v in pos):
        return "-"
    return ", ".join(str(v) for v in pos)
