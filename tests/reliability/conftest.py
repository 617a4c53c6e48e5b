"""Figures of the reliability suite: every test adds what it ran, the session prints the sum.

Set RELIABILITY_FIGURES=/path/file.json to also get them as JSON (docs/RELIABILITY.md quotes
the figures of the last run).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

FIGURES: Counter = Counter()


@pytest.fixture
def figures() -> Counter:
    """Add to it: scenarios, kills, rows_compared, mismatches, ..."""
    return FIGURES


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if not FIGURES:
        return
    terminalreporter.write_line("reliability figures: " + json.dumps(dict(sorted(FIGURES.items()))))
    path = os.environ.get("RELIABILITY_FIGURES")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(FIGURES.items())), f, indent=2)
