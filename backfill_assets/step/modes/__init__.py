"""One module per backfill mode, each declaring its `Mode` (step/request.py); the one place a
mode is chosen by name."""

from __future__ import annotations

from backfill_assets.core.errors import InvalidMVDefinition
from backfill_assets.core.mv_definition import MODE_NAMES
from backfill_assets.step.modes.arrangement import ARRANGEMENT
from backfill_assets.step.modes.no_shuffle import NO_SHUFFLE
from backfill_assets.step.modes.snapshot import SNAPSHOT
from backfill_assets.step.request import Mode

MODES: dict[str, Mode] = {m.name: m for m in (ARRANGEMENT, NO_SHUFFLE, SNAPSHOT)}


def mode_named(name: str) -> Mode:
    """The mode an MV definition names (`MVDefinition.mode`)."""
    try:
        return MODES[name]
    except KeyError:
        raise InvalidMVDefinition(
            f"mode {name!r} is not one of {', '.join(MODE_NAMES)}") from None
