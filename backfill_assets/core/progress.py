"""Per-vnode backfill progress and the committed/current state of a run's vnodes.

Why committed *and* current: a step moves progress in memory while it reads the snapshot,
and only the progress commit makes that durable. Comparing the two values tells which
progress rows to write and whether as insert or update, as the reference's
``persist_state_per_vnode`` does; a crash simply drops the current value.

Transitions (anything else raises InvalidProgressTransition):
``NotStarted --update--> InProgress --update--> InProgress --finish--> Completed``,
``NotStarted --finish--> Completed(all-null placeholder, 0 rows)``, ``Completed --finish-->``
itself; positions strictly grow, row counts only grow, versions never go back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from backfill_assets.core.errors import (
    BackfillError,
    CorruptProgressRow,
    InvalidProgressTransition,
    InvalidVnode,
)
from backfill_assets.core.keys import Key, KeyOrder


@dataclass(frozen=True)
class NotStarted:
    """No snapshot row read yet: no progress row exists and no change is visible."""

    finished: ClassVar[bool] = False

    @property
    def current_pos(self) -> None:
        return None

    @property
    def row_count(self) -> int:
        return 0


@dataclass(frozen=True)
class InProgress:
    """Snapshot read up to and including ``current_pos``; changes at or before it apply."""

    current_pos: Key
    row_count: int
    finished: ClassVar[bool] = False


@dataclass(frozen=True)
class Completed:
    """Snapshot exhausted; every change applies. ``current_pos`` is the last key read, or the
    all-null tuple (``KeyOrder.placeholder()``) when the vnode's snapshot was empty; ``None``
    is accepted on input (recovery, encode) and becomes that tuple."""

    current_pos: Key
    row_count: int
    finished: ClassVar[bool] = True


VnodeProgress = NotStarted | InProgress | Completed


@dataclass(frozen=True)
class ProgressWrite:
    """One progress row to write at commit time."""

    vnode: int
    kind: Literal["insert", "update"]
    progress: InProgress | Completed
    version: int


def is_count(value: object) -> bool:
    """A non-negative int that is not a bool (bool is an int subclass in Python)."""
    return type(value) is int and value >= 0


def check_vnode(vnode: object) -> int:
    if not is_count(vnode):
        raise InvalidVnode(f"vnode {vnode!r} must be a non-negative int")
    return vnode  # type: ignore[return-value]


def check_progress(
    key_order: KeyOrder, vnode: int, progress: object, version: object
) -> tuple[VnodeProgress, int | None]:
    """Validate a recovered (progress, version) and return it with a normalized position."""

    def corrupt(what: str) -> CorruptProgressRow:
        return CorruptProgressRow(
            f"progress of vnode {vnode} is corrupt: {what}; the backfill_progress table was "
            "edited or written by another version: drop the MV's state to rebuild it"
        )

    if isinstance(progress, NotStarted):
        if version is not None:
            raise corrupt("NotStarted has no progress row, so it cannot carry a version")
        return progress, None
    if not isinstance(progress, InProgress | Completed):
        raise corrupt(f"{progress!r} is not NotStarted, InProgress or Completed")
    if not is_count(version):
        raise corrupt(f"version {version!r} is missing or negative")
    if not is_count(progress.row_count):
        raise corrupt(f"row_count {progress.row_count!r} is not a non-negative int")
    pos = progress.current_pos
    if isinstance(progress, Completed) and (pos is None or key_order.is_placeholder(pos)):
        if progress.row_count:
            raise corrupt("an empty finished vnode (all-null pk) must have row_count 0")
        return Completed(key_order.placeholder(), 0), version  # type: ignore[return-value]
    try:
        pos = key_order.normalize(pos)
    except BackfillError as e:
        raise corrupt(f"position {pos!r}: {e}") from e
    return type(progress)(pos, progress.row_count), version  # type: ignore[return-value]


@dataclass
class _Slot:
    committed: VnodeProgress
    committed_version: int | None
    current: VnodeProgress
    current_version: int | None


class BackfillState:
    """Committed and current progress (and the version each is valid at) of a run's vnodes."""

    def __init__(
        self,
        key_order: KeyOrder,
        vnodes: Iterable[int],
        recovered: Mapping[int, tuple[VnodeProgress, int | None]] | None = None,
    ) -> None:
        self.key_order = key_order
        own = sorted({check_vnode(v) for v in vnodes})
        recovered = dict(recovered or {})
        stray = sorted(set(recovered) - set(own), key=repr)
        if stray:
            raise InvalidVnode(
                f"recovered progress for vnodes {stray} that are not part of this run: "
                "recover only the run's vnodes"
            )
        self._slots: dict[int, _Slot] = {}
        for v in own:
            p, ver = check_progress(key_order, v, *recovered.get(v, (NotStarted(), None)))
            self._slots[v] = _Slot(p, ver, p, ver)

    @property
    def vnodes(self) -> tuple[int, ...]:
        return tuple(self._slots)

    def copy(self) -> BackfillState:
        """An independent state with the same progress (already checked: a recovery kept
        by table versions hands out copies instead of checking every vnode again)."""
        out = BackfillState(self.key_order, ())
        out._slots = {v: _Slot(s.committed, s.committed_version, s.current, s.current_version)
                      for v, s in self._slots.items()}
        return out

    def _slot(self, vnode: int) -> _Slot:
        slot = self._slots.get(vnode)  # type: ignore[call-overload]
        if slot is None:
            raise InvalidVnode(
                f"vnode {vnode!r} is not part of this run ({len(self._slots)} vnodes): "
                "plan and apply steps only for the run's vnodes"
            )
        return slot

    def current(self, vnode: int) -> VnodeProgress:
        return self._slot(vnode).current

    def committed(self, vnode: int) -> VnodeProgress:
        return self._slot(vnode).committed

    def version(self, vnode: int) -> int | None:
        """The committed version (None while no progress row exists)."""
        return self._slot(vnode).committed_version

    def current_version(self, vnode: int) -> int | None:
        """The version the current (uncommitted) progress is valid at."""
        return self._slot(vnode).current_version

    def progress_map(self) -> dict[int, VnodeProgress]:
        """Current progress of every vnode, e.g. for ``changes.visible``."""
        return {v: s.current for v, s in self._slots.items()}

    def update(self, vnode: int, new_pos: Key, rows: int) -> None:
        """Advance a vnode's position after a snapshot chunk of ``rows`` rows."""
        slot = self._slot(vnode)
        cur = slot.current
        if isinstance(cur, Completed):
            raise InvalidProgressTransition(
                f"vnode {vnode} is Completed; its position never moves again: plan no "
                "snapshot read for a finished vnode"
            )
        _check_rows(vnode, rows)
        pos = self.key_order.normalize(new_pos)
        if isinstance(cur, InProgress) and self.key_order.compare(pos, cur.current_pos) <= 0:
            raise InvalidProgressTransition(
                f"vnode {vnode}: new position {pos!r} is not after {cur.current_pos!r}; "
                "positions only grow: read the snapshot strictly after the current position"
            )
        slot.current = InProgress(pos, cur.row_count + rows)

    def finish(self, vnode: int, rows: int = 0) -> None:
        """Mark a vnode Completed (its snapshot is exhausted); ``rows`` adds to its count."""
        slot = self._slot(vnode)
        cur = slot.current
        _check_rows(vnode, rows)
        if isinstance(cur, Completed):
            if rows:
                raise InvalidProgressTransition(
                    f"vnode {vnode} is already Completed; it reads no more rows"
                )
            return
        if isinstance(cur, NotStarted):
            if rows:
                raise InvalidProgressTransition(
                    f"vnode {vnode} is NotStarted: rows read must come with a position "
                    "(call update first)"
                )
            slot.current = Completed(self.key_order.placeholder(), 0)
            return
        slot.current = Completed(cur.current_pos, cur.row_count + rows)

    def advance_version(self, vnode: int, v_new: int) -> None:
        """Make the current progress valid at ``v_new`` (versions never go back)."""
        slot = self._slot(vnode)
        if not is_count(v_new):
            raise InvalidProgressTransition(f"version {v_new!r} must be a non-negative int")
        if slot.current_version is not None and v_new < slot.current_version:
            raise InvalidProgressTransition(
                f"vnode {vnode} is at version {slot.current_version}, cannot go back to "
                f"{v_new}: a barrier must be a version >= the recorded one (if the upstream "
                "table was recreated or restored, drop the MV's state and rebuild)"
            )
        slot.current_version = v_new

    def commit_plan(self) -> list[ProgressWrite]:
        """Progress rows to write: vnodes whose current (progress, version) differs from the
        committed one; insert when no row exists yet. NotStarted writes nothing."""
        writes = []
        for v, s in self._slots.items():
            if isinstance(s.current, NotStarted):
                continue
            if (s.current, s.current_version) == (s.committed, s.committed_version):
                continue
            if s.current_version is None:
                raise InvalidProgressTransition(
                    f"vnode {v} has progress but no version: call advance_version before "
                    "committing"
                )
            kind = "insert" if isinstance(s.committed, NotStarted) else "update"
            writes.append(ProgressWrite(v, kind, s.current, s.current_version))
        return writes

    def mark_committed(self) -> None:
        """The commit plan was written: current becomes committed (NotStarted has no row)."""
        for s in self._slots.values():
            if not isinstance(s.current, NotStarted):
                s.committed, s.committed_version = s.current, s.current_version

    def unfinished_vnodes(self) -> list[int]:
        return [v for v, s in self._slots.items() if not s.current.finished]

    def is_finished(self) -> bool:
        return all(s.current.finished for s in self._slots.values())

    def snapshot_rows(self) -> int:
        """Snapshot rows read so far over all vnodes (current values)."""
        return sum(s.current.row_count for s in self._slots.values())


def _check_rows(vnode: int, rows: object) -> None:
    if not is_count(rows):
        raise InvalidProgressTransition(
            f"vnode {vnode}: row count delta {rows!r} must be a non-negative int; "
            "row counts only grow"
        )
