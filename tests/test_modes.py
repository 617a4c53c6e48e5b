"""The modes are chosen in one place (`step.modes.mode_named`), and each declares what differs
about it in its `Mode`: nothing else in the package asks a mode's name (issue 39)."""

from __future__ import annotations

import pathlib
import re

import pytest

from backfill_assets.core.errors import InvalidMVDefinition
from backfill_assets.core.mv_definition import MODES as MODE_NAMES
from backfill_assets.step.modes import MODES, mode_named

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "backfill_assets"


def test_every_mode_a_definition_may_name_has_one_module():
    assert sorted(MODES) == sorted(MODE_NAMES)
    for name in MODE_NAMES:
        mode = mode_named(name)
        assert mode.name == name and mode.positions().name == name
    with pytest.raises(InvalidMVDefinition, match="not one of"):
        mode_named("bogus")


def test_what_each_mode_declares():
    facts = {name: (m.owns_replica, m.shares_position, m.check_upstream is not None,
                    m.run_barrier is not None) for name, m in MODES.items()}
    assert facts == {"arrangement": (True, False, False, False),
                     "no_shuffle": (False, True, True, False),
                     "snapshot": (False, False, False, True)}


def test_the_step_never_dispatches_on_a_mode_name():
    """In the step layer, a comparison with a mode's name outside step/modes/ would be a
    second place the mode is chosen: the step asks the request's `Mode`."""
    pattern = re.compile(r"mode\s*[!=]=\s*[\"'](arrangement|no_shuffle|snapshot)[\"']")
    found = [f"{p.relative_to(PACKAGE)}: {line.strip()}"
             for p in (PACKAGE / "step").rglob("*.py") if "modes" not in p.parts
             for line in p.read_text().splitlines() if pattern.search(line)]
    assert not found, "\n".join(found)
