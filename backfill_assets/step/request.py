"""What a step is asked (a `StepRequest`, with the `Mode` that runs it) and what it answers (a
`StepReport`): apart from the loop so that the modes (step/modes/), which the loop serves and
one of which runs the loop several times per barrier, can name them without importing it.

A `Mode` is everything that differs between the backfill modes, declared once per mode in
step/modes/ and chosen in one place (`step.modes.mode_named`): the loop asks the request's
mode, never the mode's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from backfill_assets.core.keys import KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.positions import PositionStrategy
from backfill_assets.core.progress import Completed
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.source_context import SnapshotSource
from backfill_assets.storage import TableHead

Hook = Callable[[str], None]
# a check of the upstream (as opened at the barrier) that raises a named error before any write
UpstreamCheck = Callable[[DeltaTable | TableHead, MVDefinition, KeyOrder, MVTables], None]


def no_hook(point: str) -> None:
    """Production default: kill points cost one call."""


@dataclass(frozen=True)
class Mode:
    """One backfill mode: how positions move, where its snapshot comes from, what it checks
    and keeps, and how it runs a barrier."""

    name: str  # the user-facing name (MVDefinition.mode)
    positions: Callable[[], PositionStrategy]  # a fresh position strategy for one step
    source: SnapshotSource  # where a step's snapshot rows come from
    check_upstream: UpstreamCheck | None = None  # what this mode needs of the upstream
    # the steps of one barrier (snapshot mode: catch-up, slices); None: one `run_step`
    barrier_steps: Callable[[SparkSession, StepRequest, Hook], StepReport] | None = None
    # the mode whose steps a barrier runs under a rate limit or a pause (snapshot mode's
    # chunked path: arrangement's); None: this mode's own
    throttled_path: Mode | None = None

    @property
    def shares_position(self) -> bool:
        """One position for all the vnodes of a run (no_shuffle): the run's vnode layout is
        recorded and re-splits are fenced (mv/run_layout.py)."""
        return self.positions().shared

    @property
    def owns_replica(self) -> bool:
        """Keeps `replicated_state` (arrangement), whose partitions its barriers materialize."""
        return self.positions().uses_replica

    def keeps_replica(self, throttled: bool) -> bool:
        """Whether a barrier keeps `replicated_state`: this mode owns it (arrangement), or the
        barrier is ``throttled`` (a rate limit or a pause) and runs the steps of a mode that
        does (snapshot mode's chunked path)."""
        path = self.throttled_path if throttled and self.throttled_path else self
        return path.owns_replica

    @property
    def bulk(self) -> bool:
        """A read takes every remaining row of a vnode at one pinned version (snapshot mode);
        otherwise a barrier reads chunks of ``chunk_size`` rows per vnode."""
        return self.positions().bulk

    @property
    def seeks_upstream(self) -> bool:
        """Its chunks are read by a seek of the upstream's own files, laid out by whoever
        writes the upstream (no_shuffle), so that layout can bound the read
        (core/read_cost.py)."""
        positions = self.positions()
        return not positions.uses_replica and not positions.bulk


@dataclass(frozen=True)
class StepRequest:
    """One barrier for `vnodes` of the MV `definition`, run by `mode` (the definition's, or
    the path a mode takes for it: snapshot mode's chunked steps are arrangement's)."""

    definition: MVDefinition
    mode: Mode
    tables: MVTables
    vnodes: tuple[int, ...]
    chunk_size: int
    rate_limit: int | None = None
    v_new: int | None = None  # None: the upstream's latest version
    reset: tuple[int, ...] = ()  # vnodes re-read from scratch: their MV rows are replaced


@dataclass
class StepReport:
    """What one step did; becomes Dagster materialization metadata."""

    v_new: int
    vnodes: tuple[int, ...]
    chunk_limit: int
    snapshot_rows: int = 0
    forwarded_rows: int = 0
    replicated_rows: int = 0
    seconds: float = 0.0
    recovered: list[int] = field(default_factory=list)
    progress: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # mode-specific figures for the run's metadata
    engine: str = "spark"  # "driver": changes kept on the driver and no snapshot rows read

    @property
    def finished(self) -> bool:
        return all(isinstance(p, Completed) for p in self.progress.values())

    @property
    def paused(self) -> bool:
        return self.chunk_limit == 0


def merged(reports: list[StepReport]) -> StepReport:
    """Steps of one barrier (over the same vnodes, or over slices of them) as one report: the
    sums of what they did, each vnode's last state (and the last step's extra figures)."""
    last = reports[-1]
    out = replace(last, progress={}, versions={}, extra=dict(last.extra), recovered=[])
    for r in reports:
        out.recovered += [v for v in r.recovered if v not in out.recovered]
        out.progress.update(r.progress)
        out.versions.update(r.versions)
    out.vnodes = tuple(sorted(out.progress))
    out.snapshot_rows = sum(r.snapshot_rows for r in reports)
    out.forwarded_rows = sum(r.forwarded_rows for r in reports)
    out.replicated_rows = sum(r.replicated_rows for r in reports)
    out.seconds = sum(r.seconds for r in reports)
    return out
