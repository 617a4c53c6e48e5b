"""Choose by cost, as Databricks' Enzyme does: a barrier over finished vnodes either applies its
change set (the change feed netted and merged into the MV) or re-snapshots the vnodes (re-reads
them whole at the barrier's version, replacing their MV rows), whichever costs less.

Why: applying costs about what changed, re-reading about what the vnodes hold. A barrier that
carries a large share of the vnodes' rows (a bulk UPDATE, a writer that rewrote a partition,
a long catch-up) can cost more to apply, row by row through key lookups and catch-up steps,
than to read again. Both paths land the MV at the same rows (the re-snapshot's commit writes
only the real differences to the MV's change feed), so the choice is about time alone.

The model is pure and deliberately small: each path costs a fixed part plus rows times a unit
cost (seconds per row). The rows are estimates the caller takes from the upstream's log and
file statistics; the unit costs are what this MV's own earlier barriers measured, smoothed
(`UnitCosts.observed`), starting from defaults measured on the development machine
(`DEFAULT_APPLY_SECONDS_PER_ROW`, `DEFAULT_RESNAPSHOT_SECONDS_PER_ROW`, benchmarks/
bench_crossover.py). A re-snapshot must win by `RESNAPSHOT_MARGIN`: near the crossover the two
cost the same, and applying rewrites fewer files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from backfill_assets.core.figures import compact_vnodes

AUTO, APPLY, RESNAPSHOT = "auto", "apply", "resnapshot"
CHOICES = (AUTO, APPLY, RESNAPSHOT)  # the `barrier_choice` control: auto, or forced either way

# Defaults before this MV measured anything: snapshot mode, a 1M-row upstream of 256 vnodes on
# this 2-core machine (benchmarks/results/crossover_1M.json, 1% to 100% of rows changed in one
# barrier). Applying: 4.0-8.8 us per estimated change-feed row beyond its fixed part, catch-up
# steps included, rising with the change set (more steps, each opening tables whose logs the
# barrier itself lengthens). Re-reading: 4.6-4.8 us per vnode row beyond its fixed part, 8.7
# for the first re-snapshot of a process (JIT). Fixed parts: what each path costs with next to
# no rows (a step's opening and commits; a re-snapshot's Spark jobs), fitted on the same runs.
DEFAULT_APPLY_SECONDS_PER_ROW = 7e-6
DEFAULT_RESNAPSHOT_SECONDS_PER_ROW = 5e-6
APPLY_FIXED_SECONDS = 0.15
RESNAPSHOT_FIXED_SECONDS = 2.5
RESNAPSHOT_MARGIN = 0.1  # a re-snapshot is chosen when it costs at most 90% of applying
# a barrier of fewer rows than this says little about the unit cost: its fixed part dominates
# (1% of 1M rows, 14.5k change rows: 19 us per row beyond 0.1 s; 10%: 5 us)
MIN_SAMPLE_ROWS = 50_000
SMOOTHING = 0.25  # weight of a new sample once a figure has 3 or more behind it


@dataclass(frozen=True)
class UnitCost:
    """Seconds per row of one path, and how many measured barriers are behind the figure (0:
    the default)."""

    seconds_per_row: float
    samples: int = 0

    def observed(self, rows: int, seconds: float, fixed: float) -> UnitCost:
        """The figure after a barrier that took `seconds` for `rows` estimated rows: the fixed
        part taken off, then averaged in log space (a ratio: a sample twice the figure and one
        half of it cancel out), as a running mean for the first samples (the default counts as
        one) and a moving average of weight `SMOOTHING` after that. A barrier of fewer than
        `MIN_SAMPLE_ROWS` rows changes nothing."""
        if rows < MIN_SAMPLE_ROWS or seconds <= 0:
            return self
        sample = max(seconds - fixed, seconds / 10) / rows
        weight = max(1.0 / (self.samples + 2), SMOOTHING)
        smoothed = math.exp((1 - weight) * math.log(self.seconds_per_row)
                            + weight * math.log(sample))
        return UnitCost(smoothed, self.samples + 1)


@dataclass(frozen=True)
class UnitCosts:
    """What this MV's barriers measured: seconds per change row applied and per vnode row
    re-read (kept beside the MV's tables: mv/unit_costs.py)."""

    apply: UnitCost = field(default_factory=lambda: UnitCost(DEFAULT_APPLY_SECONDS_PER_ROW))
    resnapshot: UnitCost = field(
        default_factory=lambda: UnitCost(DEFAULT_RESNAPSHOT_SECONDS_PER_ROW))

    def observed(self, path: str, rows: int, seconds: float) -> UnitCosts:
        """These costs after a barrier took `seconds` on `path` (APPLY or RESNAPSHOT) for
        `rows` estimated rows (change rows applied, or vnode rows re-read)."""
        if path == APPLY:
            return replace(self, apply=self.apply.observed(rows, seconds, APPLY_FIXED_SECONDS))
        if path == RESNAPSHOT:
            return replace(self, resnapshot=self.resnapshot.observed(
                rows, seconds, RESNAPSHOT_FIXED_SECONDS))
        raise ValueError(f"unknown barrier path {path!r}: {APPLY} or {RESNAPSHOT}")

    def to_json(self) -> dict:
        return {p: {"seconds_per_row": c.seconds_per_row, "samples": c.samples}
                for p, c in ((APPLY, self.apply), (RESNAPSHOT, self.resnapshot))}

    @classmethod
    def from_json(cls, doc: dict | None) -> UnitCosts:
        """The costs a document holds; defaults for a path it lacks or holds nonsense for."""
        out = cls()
        for path in (APPLY, RESNAPSHOT):
            entry = (doc or {}).get(path)
            entry = entry if isinstance(entry, dict) else {}
            rate, samples = entry.get("seconds_per_row"), entry.get("samples", 0)
            if isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate) \
                    and isinstance(samples, int) and samples >= 0:
                out = replace(out, **{path: UnitCost(float(rate), samples)})
        return out


def apply_seconds(change_rows: int, costs: UnitCosts) -> float:
    """Estimated seconds to apply `change_rows` change rows."""
    return APPLY_FIXED_SECONDS + change_rows * costs.apply.seconds_per_row


def resnapshot_seconds(vnode_rows: int | None, costs: UnitCosts) -> float:
    """Estimated seconds to re-read vnodes holding `vnode_rows` upstream rows (None: not
    estimated; the fixed part, a lower bound)."""
    return RESNAPSHOT_FIXED_SECONDS + (vnode_rows or 0) * costs.resnapshot.seconds_per_row


def vnode_rows_needed(change_rows: int, costs: UnitCosts, control: str = AUTO) -> bool:
    """Whether the choice needs the vnodes' rows (read from the upstream's file statistics):
    not when applying costs less than a re-snapshot's fixed part alone, by the margin, so an
    ordinary small barrier does not list the upstream's files. A forced choice records both
    estimates."""
    return control != AUTO or \
        RESNAPSHOT_FIXED_SECONDS <= (1 - RESNAPSHOT_MARGIN) * apply_seconds(change_rows, costs)


@dataclass(frozen=True)
class Decision:
    """What a barrier over finished vnodes does, and why (its Dagster metadata)."""

    resnapshot: bool
    vnodes: tuple[int, ...]
    version: int
    change_rows: int
    vnode_rows: int | None  # None: not estimated (`vnode_rows_needed`)
    apply_seconds: float
    resnapshot_seconds: float
    costs: UnitCosts
    forced: str = AUTO  # the control in force: AUTO, or the path it forces

    @property
    def choice(self) -> str:
        """`apply changes` or `re-snapshot vnodes a..b`."""
        return f"re-snapshot vnodes {compact_vnodes(self.vnodes)}" if self.resnapshot else \
            "apply changes"

    @property
    def reason(self) -> str:
        """Both estimates and what decided between them."""
        reread = (f"re-reading ~{self.vnode_rows:,} vnode rows at v{self.version}: "
                  f"~{self.resnapshot_seconds:.2f} s ({_micros(self.costs.resnapshot)})"
                  if self.vnode_rows is not None else
                  f"re-reading the vnodes at v{self.version}: at least its fixed "
                  f"{self.resnapshot_seconds:.2f} s (vnode rows not estimated)")
        estimates = (f"applying ~{self.change_rows:,} change rows: ~{self.apply_seconds:.2f} s "
                     f"({_micros(self.costs.apply)}); {reread}")
        if self.forced != AUTO:
            return f"forced by barrier_choice={self.forced}; estimates: {estimates}"
        rule = (f"re-reading costs at most {1 - RESNAPSHOT_MARGIN:.0%} of applying"
                if self.resnapshot else
                f"re-reading would not cost {1 - RESNAPSHOT_MARGIN:.0%} of applying or less")
        return f"{rule}: {estimates}"

    def metadata(self) -> dict[str, object]:
        """The barrier's figures of the choice (StepReport.extra)."""
        return {
            "barrier_choice": self.choice,
            "barrier_choice_reason": self.reason,
            "barrier_choice_control": self.forced,
            "estimated_change_rows": self.change_rows,
            **({} if self.vnode_rows is None else {"estimated_vnode_rows": self.vnode_rows}),
            "estimated_apply_seconds": round(self.apply_seconds, 3),
            "estimated_resnapshot_seconds": round(self.resnapshot_seconds, 3),
            "apply_us_per_row": round(self.costs.apply.seconds_per_row * 1e6, 3),
            "resnapshot_us_per_row": round(self.costs.resnapshot.seconds_per_row * 1e6, 3),
            "apply_cost_samples": self.costs.apply.samples,
            "resnapshot_cost_samples": self.costs.resnapshot.samples,
        }


def choose(change_rows: int, vnode_rows: int | None, vnodes: tuple[int, ...], version: int,
           costs: UnitCosts, control: str = AUTO) -> Decision:
    """Apply or re-snapshot `vnodes` (all finished) at `version`: by the estimates, unless the
    `barrier_choice` control forces a path (benchmarks, an operator who knows better).
    `vnode_rows` None (not estimated) only where `vnode_rows_needed` says so."""
    if control not in CHOICES:
        raise ValueError(f"barrier_choice {control!r}: one of {', '.join(CHOICES)}")
    if not vnodes:
        raise ValueError("a choice needs the barrier's vnodes")
    if vnode_rows is None and vnode_rows_needed(change_rows, costs, control):
        raise ValueError("this choice needs the vnodes' rows: see vnode_rows_needed")
    change_rows = max(0, change_rows)
    vnode_rows = None if vnode_rows is None else max(0, vnode_rows)
    apply = apply_seconds(change_rows, costs)
    reread = resnapshot_seconds(vnode_rows, costs)
    if control == AUTO:
        resnapshot = reread <= (1 - RESNAPSHOT_MARGIN) * apply
    else:
        resnapshot = control == RESNAPSHOT
    return Decision(resnapshot, tuple(vnodes), version, change_rows, vnode_rows, apply, reread,
                    costs, control)


def _micros(cost: UnitCost) -> str:
    source = f"{cost.samples} measured" if cost.samples else "default"
    return f"{cost.seconds_per_row * 1e6:.2f} us/row, {source}"
