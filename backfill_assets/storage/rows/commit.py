"""Commits the storage layer writes itself: data files, deletion vectors, change files.

delta-rs cannot commit a deletion vector, so the layer writes the log entry: one NDJSON file
``_delta_log/<version>.json`` published with put-if-absent, so an existing version is never
overwritten and of two writers racing for a version exactly one wins. The loser re-reads the
log and commits on top of the winner when the winner touched nothing of its own: none of its
application transactions (the same vnodes: fencing) and none of the files it removes. Files
both DV'd (runs over different vnodes sharing a file) are rebased: the new DV is the winner's
OR ours. A checkpoint is written through delta-rs every CHECKPOINT_INTERVAL versions, and
after a commit of CHECKPOINT_ACTIONS files or more: a reader replays the JSON commits since the
last checkpoint, and the replica's copy commits one add per file with its statistics (thousands
of them on a large table), which a checkpoint's parquet loads several times faster than JSON.

Why the checkpoint is written in the background (`checkpoint_later`): delta-rs loads the
whole table at the version to write it, and a barrier commits to several tables (MV,
progress, state, kept input, replica), so a checkpoint due on any of them landed on the
barrier's critical path every few barriers. The commit is complete without it (a checkpoint
only shortens later replays), so the commit returns first and one thread writes the
checkpoints after it, in commit order; the interpreter waits for that thread at exit. A crash
in it loses nothing: a missing checkpoint is legal Delta, and a torn one is never seen
(delta-rs publishes the parquet whole, then ``_last_checkpoint``; our own replay takes only
a complete checkpoint, `log.read_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from deltalake import DeltaTable
from pyroaring import BitMap64

from backfill_assets.core.errors import ConcurrentBackfillRun
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.log import DataFile, TableVersion, commit_uri
from backfill_assets.storage.rows import key_cache
from backfill_assets.storage.rows.write import NewFile
from backfill_assets.storage.store import conditional, objects

Hook = Callable[[str], None]
CHECKPOINT_INTERVAL = 50
CHECKPOINT_ACTIONS = 1000  # files a commit adds or removes that make it worth a checkpoint
COMMIT_ATTEMPTS = 20
ENGINE = "backfill-assets storage layer"
LOG = logging.getLogger(__name__)


@dataclass
class Intent:
    """Why a commit is made: its application transactions and commit metadata."""

    txns: Mapping[str, int] = field(default_factory=dict)  # app id -> upstream version
    metadata: Mapping[str, str] = field(default_factory=dict)
    operation: str = "WRITE"
    # the log entry on disk before it is visible (local disks); False only for a table whose
    # commit another table's carries, so a power cut that loses it loses nothing (progress)
    durable: bool = True


@dataclass
class Change:
    """What one commit does to a table."""

    adds: list[NewFile] = field(default_factory=list)
    cdc: list[NewFile] = field(default_factory=list)
    deletes: dict[str, BitMap64] = field(default_factory=dict)  # file path -> rows deleted now
    removes: list[DataFile] = field(default_factory=list)  # files removed whole (compaction)
    data_change: bool = True

    @property
    def empty(self) -> bool:
        return not (self.adds or self.cdc or self.removes or any(self.deletes.values()))


def _no_hook(point: str) -> None:
    """Production default: the crash tests' kill points cost one call."""


def commit(snap: TableVersion, change: Change, intent: Intent, hook: Hook = _no_hook) -> int:
    """Commit ``change`` on top of ``snap`` (the version it was planned on); the new version.
    Raises ConcurrentBackfillRun when another writer took this step's vnodes or files."""
    conditional.check_conditional_writes(snap.uri, snap.storage_options)  # once per store
    base = snap
    for _ in range(COMMIT_ATTEMPTS):
        target = base.version + 1
        payload = _entry(base, change, intent)
        hook("dv_file_written")
        if objects.put_if_absent(commit_uri(snap.uri, target), payload, snap.storage_options,
                                 sync=intent.durable):
            _maybe_checkpoint(snap, target, change)
            return target
        winner = TableVersion.load(snap.uri, None, snap.storage_options)
        _check_rebase(snap, winner, change, intent)
        base = winner
    raise ConcurrentBackfillRun(
        f"{snap.uri}: {COMMIT_ATTEMPTS} commit attempts lost the race to other writers; "
        "nothing of this step was written: rerun it")


def _entry(base: TableVersion, change: Change, intent: Intent) -> bytes:
    """The NDJSON of the commit against ``base`` (DVs rebased onto its files)."""
    now = int(time.time() * 1000)
    actions: list[dict] = []
    live = base.by_path() if change.deletes else {}  # an append needs no file list
    bitmaps, targets = [], []
    for path, rows in sorted(change.deletes.items()):
        if not rows:
            continue
        f = live[path]
        merged = BitMap64(rows) | existing_deleted(base, f)
        actions.append({"remove": _remove(f, now, change.data_change)})
        if len(merged) < (f.num_records or 0):
            bitmaps.append(merged)
            targets.append(f)
    if bitmaps:
        dv_file = dv.encode_file(bitmaps)
        objects.write_bytes(objects.join(base.uri, dv_file.relative_path), dv_file.data,
                            base.storage_options)
        for f, descriptor, bitmap in zip(targets, dv_file.descriptors, bitmaps, strict=True):
            actions.append({"add": _with_dv(f, descriptor, now, change.data_change)})
            key_cache.CACHE.remember_deleted(base.uri, dv.unique_id(descriptor), bitmap)
    for f in change.removes:
        actions.append({"remove": _remove(f, now, change.data_change)})
    for f in change.adds:
        add = {"path": f.path, "partitionValues": {}, "size": f.size,
               "modificationTime": now, "dataChange": change.data_change, "stats": f.stats}
        if f.tags:
            add["tags"] = f.tags
        actions.append({"add": add})
    for f in change.cdc:
        actions.append({"cdc": {"path": f.path, "partitionValues": {}, "size": f.size,
                                "dataChange": False}})
    for app_id, version in sorted(intent.txns.items()):
        actions.append({"txn": {"appId": app_id, "version": int(version), "lastUpdated": now}})
    info = {"timestamp": now, "operation": intent.operation, "operationParameters": {},
            "engineInfo": ENGINE, "readVersion": base.version,
            "isBlindAppend": not (change.deletes or change.removes)}
    info.update(intent.metadata)
    actions.insert(0, {"commitInfo": info})
    return "\n".join(json.dumps(a, separators=(",", ":")) for a in actions).encode() + b"\n"


def existing_deleted(snap: TableVersion, f: DataFile) -> BitMap64:
    """The rows of ``f`` its current DV deletes (empty without one; decoded once per
    process, `key_cache`)."""
    if not f.deletion_vector:
        return BitMap64()
    return key_cache.CACHE.deleted_rows(
        snap.uri, dv.unique_id(f.deletion_vector),
        lambda: dv.load(snap.uri, f.deletion_vector, snap.storage_options))


def _remove(f: DataFile, now: int, data_change: bool) -> dict:
    add = f.add_action or {"path": f.path, "partitionValues": {}, "size": f.size}
    out = {"path": add["path"], "deletionTimestamp": now, "dataChange": data_change,
           "extendedFileMetadata": True, "partitionValues": add.get("partitionValues", {}),
           "size": add["size"]}
    for key in ("stats", "deletionVector"):
        if add.get(key):
            out[key] = add[key]
    return out


def _with_dv(f: DataFile, descriptor: dict, now: int, data_change: bool) -> dict:
    add = dict(f.add_action or {"path": f.path, "partitionValues": {}, "size": f.size})
    stats = json.loads(add.get("stats") or "{}")
    stats["tightBounds"] = False
    add.update({"modificationTime": now, "dataChange": data_change, "stats": json.dumps(stats),
                "deletionVector": descriptor})
    return add


def _check_rebase(planned: TableVersion, winner: TableVersion, change: Change,
                  intent: Intent) -> None:
    """Whether this change may still commit on top of ``winner``; raises when not."""
    ours = set(intent.txns)
    for v in range(planned.version + 1, winner.version + 1):
        raw = objects.read_bytes(commit_uri(planned.uri, v), planned.storage_options)
        for line in raw.decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            taken = action.get("txn", {}).get("appId")
            if taken in ours:
                raise ConcurrentBackfillRun(
                    f"another run committed {taken!r} to {planned.uri} (version {v}) while this "
                    "one was working on the same vnodes; nothing of this step was written: "
                    "rerun it, and give concurrent runs disjoint vnode ranges")
            if "metaData" in action or "protocol" in action:
                raise ConcurrentBackfillRun(
                    f"{planned.uri} changed its schema or protocol at version {v} while this "
                    "step was working; nothing was written: rerun it")
    live = winner.by_path()
    gone = [p for p in change.deletes if p not in live]
    gone += [f.path for f in change.removes
             if f.path not in live or dv.unique_id(live[f.path].deletion_vector)
             != dv.unique_id(f.deletion_vector)]
    if gone:
        raise ConcurrentBackfillRun(
            f"{len(gone)} files this step rewrites in {planned.uri} were removed by another "
            f"writer (e.g. {gone[0]}: compaction?); nothing was written: rerun the step")


def _maybe_checkpoint(snap: TableVersion, version: int, change: Change) -> None:
    files = len(change.adds) + len(change.removes) + len(change.deletes)
    if version % CHECKPOINT_INTERVAL == 0 or files >= CHECKPOINT_ACTIONS:
        checkpoint_later(snap.uri, version, snap.storage_options)


def checkpoint_later(uri: str, version: int, storage_options: Mapping[str, str]) -> None:
    """A checkpoint of ``uri`` at ``version``, written by the background thread (the module
    docstring: why, and why a crash in it loses nothing)."""
    future = _CHECKPOINTER.submit(_write_checkpoint, uri, version, dict(storage_options))
    with _PENDING_LOCK:  # the ones written are let go (a follower commits for days)
        _PENDING[:] = [f for f in _PENDING if not f.done() or f.exception() is not None]
        _PENDING.append(future)


def _write_checkpoint(uri: str, version: int, storage_options: dict[str, str]) -> None:
    try:
        DeltaTable(uri, version=version,
                   storage_options=storage_options or None).create_checkpoint()
    except Exception:  # a checkpoint only shortens replays: the table is whole without it
        LOG.warning("checkpoint of %s at version %s not written", uri, version, exc_info=True)
        raise


def settle_checkpoints() -> None:
    """Wait for the checkpoints begun so far (`checkpoint_later`), raising what one of them
    raised: for a caller that must see them written (tests, a maintenance job)."""
    with _PENDING_LOCK:
        pending, _PENDING[:] = list(_PENDING), []
    for future in pending:
        future.result()


_PENDING: list[Future] = []  # checkpoints submitted and not yet waited for
_PENDING_LOCK = threading.Lock()
_CHECKPOINTER = ThreadPoolExecutor(1, thread_name_prefix="delta-checkpoint")
