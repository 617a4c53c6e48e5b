"""Step planning: what one barrier (v_prev, v_new) does for a set of vnodes.

Why a plan: the step loop (adapters) must replicate, forward and read in the same way for
every mode, and every decision that can be made without data (which range of the change
feed, which vnodes read their snapshot, how many rows, paused or not) is made here, where it
is tested exhaustively.

Order of a step (docs/DESIGN.md, "The step"): replicate, forward, snapshot, commit.
Forwarding uses the positions from *before* this step's snapshot read: the snapshot is read
at ``v_new``, so it already holds every change up to ``v_new`` for the keys it brings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from backfill_assets.core.errors import (
    InconsistentSharedPosition,
    InvalidProgressTransition,
)
from backfill_assets.core.keys import Bound, compute_bounds
from backfill_assets.core.positions import PositionStrategy, check_controls, chunk_tail
from backfill_assets.core.progress import (
    BackfillState,
    NotStarted,
    ProgressWrite,
    is_count,
)


@dataclass(frozen=True)
class VnodeStepPlan:
    """What one vnode does in a step.

    ``replicate``: bring replicated_state of this vnode to v_new, from ``replicate_from``
    (None = the replica is not initialised: copy the upstream at v_new). Only unfinished
    vnodes of a mode that reads a replica replicate; a Completed vnode never reads it again.
    ``forward_from``: forward the change feed (forward_from, v_new]; None when NotStarted
    (nothing is visible, so nothing to forward). ``read_table_version``: read the next chunk at
    v_new from ``bound``.
    """

    vnode: int
    replicate_from: int | None
    forward_from: int | None
    read_table_version: bool
    replicate: bool = False
    bound: Bound | None = None


@dataclass(frozen=True)
class StepPlan:
    """The plan of one step; ``chunk_limit`` is per vnode, or in total when ``shared_read``."""

    v_new: int
    vnodes: tuple[VnodeStepPlan, ...]
    chunk_limit: int
    paused: bool
    shared_read: bool = False
    chunk_tail: int = 0  # rows beyond chunk_limit a vnode may take to finish (chunk_tail)

    def plan_for(self, vnode: int) -> VnodeStepPlan:
        for p in self.vnodes:
            if p.vnode == vnode:
                return p
        raise KeyError(vnode)

    @property
    def forward_since(self) -> dict[int, int | None]:
        """``since`` for ``changes.select_changes``: each vnode's forward start."""
        return {p.vnode: p.forward_from for p in self.vnodes}

    @property
    def snapshot_vnodes(self) -> list[int]:
        return [p.vnode for p in self.vnodes if p.read_table_version]

    @property
    def replicate_vnodes(self) -> list[int]:
        return [p.vnode for p in self.vnodes if p.replicate]


def plan_step(
    state: BackfillState,
    strategy: PositionStrategy,
    vnodes: Iterable[int],
    replica_versions: Mapping[int, int | None],
    v_new: int,
    chunk_size: int,
    rate_limit: int | None,
) -> StepPlan:
    """Plan a step. rate_limit None = unlimited, 0 = paused (the snapshot stops, forwarding
    goes on); a rate limit below chunk_size is the chunk limit; per-vnode strategies share it
    among the unfinished vnodes (see ``PositionStrategy.chunk_limit``)."""
    check_controls(chunk_size, rate_limit)
    if not is_count(v_new):
        raise InvalidProgressTransition(f"barrier version {v_new!r} must be a non-negative int")
    run = sorted(set(vnodes))
    for v in run:
        state.current(v)  # refuses vnodes outside the state
    if strategy.shared and run != list(state.vnodes):
        raise InconsistentSharedPosition(
            f"a no_shuffle step must cover all {len(state.vnodes)} vnodes of its run at once "
            f"(got {len(run)}): plan the whole run, its vnodes share one position"
        )
    strategy.recover(state)
    unfinished = [v for v in run if not state.current(v).finished]
    limit = strategy.chunk_limit(chunk_size, rate_limit, len(unfinished))
    plans = tuple(
        _plan_vnode(state, strategy, v, replica_versions.get(v), v_new, limit) for v in run
    )
    tail = 0 if strategy.shared or strategy.bulk else chunk_tail(limit, rate_limit)
    return StepPlan(v_new, plans, limit, rate_limit == 0, strategy.shared, tail)


def _plan_vnode(
    state: BackfillState,
    strategy: PositionStrategy,
    vnode: int,
    replica: int | None,
    v_new: int,
    limit: int,
) -> VnodeStepPlan:
    cur = state.current(vnode)
    recorded = state.current_version(vnode)
    if recorded is not None and v_new < recorded:
        raise InvalidProgressTransition(
            f"vnode {vnode} is at version {recorded}, the barrier {v_new} is older: versions "
            "never go back (if the upstream table was recreated or restored, drop the MV's "
            "state and rebuild)"
        )
    started = not isinstance(cur, NotStarted)
    if started and recorded is None:
        raise InvalidProgressTransition(
            f"vnode {vnode} has progress but no version: recover it with its version"
        )
    replicate = strategy.uses_replica and not cur.finished
    if replicate and replica is not None and (not is_count(replica) or replica > v_new):
        raise InvalidProgressTransition(
            f"replicated_state of vnode {vnode} is at version {replica!r}, after the barrier "
            f"{v_new}: plan a barrier at or after the replica's version, or drop the replica"
        )
    read = not cur.finished and limit > 0
    return VnodeStepPlan(
        vnode=vnode,
        replicate_from=replica if replicate else None,
        forward_from=recorded if started else None,
        read_table_version=read,
        replicate=replicate,
        bound=compute_bounds(cur.current_pos) if read else None,
    )


def commit_step(state: BackfillState, plan: StepPlan) -> list[ProgressWrite]:
    """After the step wrote the MV: make the plan's vnodes valid at v_new and return the
    progress rows to write (then call ``state.mark_committed()``)."""
    for p in plan.vnodes:
        state.advance_version(p.vnode, plan.v_new)
    return state.commit_plan()
