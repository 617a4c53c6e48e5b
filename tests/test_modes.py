"""The modes are chosen in one place (`step.modes.mode_named`), and each declares what differs
about it in its `Mode`: nothing else in the package, the resources or the jobs asks a mode's
name."""

from __future__ import annotations

import pathlib
import re

import pytest

from backfill_assets.core.errors import InvalidMVDefinition
from backfill_assets.core.mv_definition import MODE_NAMES
from backfill_assets.step.modes import MODES, mode_named

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "backfill_assets"


def test_every_mode_a_definition_may_name_has_one_module():
    assert sorted(MODES) == sorted(MODE_NAMES)
    for name in MODE_NAMES:
        mode = mode_named(name)
        assert mode.name == name and mode.positions().name == name
    with pytest.raises(InvalidMVDefinition, match="not one of"):
        mode_named("bogus")


def test_what_each_mode_declares():
    facts = {name: (m.owns_replica, m.shares_position, m.check_upstream is not None,
                    m.barrier_steps is not None) for name, m in MODES.items()}
    assert facts == {"arrangement": (True, False, False, False),
                     "no_shuffle": (False, True, True, False),
                     "snapshot": (False, False, False, True)}


def test_what_each_mode_keeps_and_reads():
    """The replica kept unthrottled and throttled (a rate limit or a pause: snapshot mode runs
    arrangement's steps), a bulk read, a seek of the upstream's own files (read_cost)."""
    facts = {name: (m.keeps_replica(False), m.keeps_replica(True), m.bulk, m.seeks_upstream)
             for name, m in MODES.items()}
    assert facts == {"arrangement": (True, True, False, False),
                     "no_shuffle": (False, False, False, True),
                     "snapshot": (False, True, True, False)}


def test_nothing_dispatches_on_a_mode_name():
    """A comparison with a mode's name outside step/modes/ (in the package, the resources or
    the jobs) would be a second place the mode is chosen: the code asks the `Mode`."""
    pattern = re.compile(r"mode\s*[!=]=\s*[\"'](arrangement|no_shuffle|snapshot)[\"']")
    found = [f"{p.relative_to(ROOT)}: {line.strip()}"
             for top in ("backfill_assets", "resources", "jobs")
             for p in (ROOT / top).rglob("*.py") if p.parent != PACKAGE / "step" / "modes"
             for line in p.read_text().splitlines() if pattern.search(line)]
    assert not found, "\n".join(found)
