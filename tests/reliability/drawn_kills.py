"""Kills at drawn commit points: one barrier run by real child processes, each SIGKILLed at
the next of ``points`` (the aggregate and join paths' random-kill tests)."""

from __future__ import annotations

from collections.abc import Sequence

from tests.reliability import harness as H


def kill_at_points(warehouse: str, raw: dict, points: Sequence[str]) -> None:
    """Run the MV's next barrier (every vnode, vnode 0 named) in a child per point, each
    killed there. The first must be killed; a later one may finish instead: the recovery it
    runs writes only the tables behind, so it may pass no later kill point."""
    for i, point in enumerate(points):
        child = H.light_backfill(H.light_args(warehouse, raw, None, [0], kill_at=point))
        assert child.killed or i, f"{point}: not killed:\n{child.output[-2000:]}"
