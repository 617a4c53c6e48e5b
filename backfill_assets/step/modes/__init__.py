"""One module per backfill mode, each declaring its `Mode` (step/request.py); the one place a
mode is chosen by name, and the one door through which barrier/ runs a mode's barrier
(`run_mode_barrier`)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from backfill_assets.core.errors import InvalidMVDefinition
from backfill_assets.core.mv_definition import MODE_NAMES
from backfill_assets.step.loop import run_step
from backfill_assets.step.modes.arrangement import ARRANGEMENT
from backfill_assets.step.modes.no_shuffle import NO_SHUFFLE
from backfill_assets.step.modes.snapshot import SNAPSHOT
from backfill_assets.step.request import Hook, Mode, StepReport, StepRequest

MODES: dict[str, Mode] = {m.name: m for m in (ARRANGEMENT, NO_SHUFFLE, SNAPSHOT)}


def mode_named(name: str) -> Mode:
    """The mode an MV definition names (`MVDefinition.mode`)."""
    try:
        return MODES[name]
    except KeyError:
        raise InvalidMVDefinition(
            f"mode {name!r} is not one of {', '.join(MODE_NAMES)}") from None


def run_mode_barrier(spark: SparkSession, req: StepRequest, hook: Hook) -> StepReport:
    """One barrier of `req.mode` at the request's rate limit: the mode's own sequence of steps
    (snapshot mode: catch-up, slices, the chunked path when throttled), else one step."""
    return (req.mode.barrier_steps or run_step)(spark, req, hook)
