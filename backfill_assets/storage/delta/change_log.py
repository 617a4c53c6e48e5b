"""A table's commits as the change-feed reader uses them, parsed once per process.

A commit file never changes, and a snapshot-mode catch-up in steps reads the same commits once
per step: parsing them again would cost steps x commits x actions. Kept per commit: its change
actions reduced to the fields the reader uses, whether it changes the metadata, its timestamp,
and its change rows by its operation metrics. A commit with change files (``cdc``) is read from
them alone (the protocol's rule for the change feed), so its ``add`` and ``remove`` lines, each
with its file statistics, are not parsed: a small barrier's upstream commit of 256 partitions
has hundreds of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.core.errors import HistoryUnavailable, StorageMismatch
from backfill_assets.storage.delta.log import TableVersion, commit_uri, unquote
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU


@dataclass(frozen=True)
class ChangeLog:
    """What a change read needs of one commit: its change actions reduced to the fields the
    readers use, and its change rows from the operation metrics (None: not recorded)."""

    actions: list[dict]
    rows: int | None


def actions_of(snap: TableVersion, v: int) -> list[dict]:
    """Commit ``v``'s change actions, partition values keyed by logical column names.

    Why translated here: under column mapping the log keys ``partitionValues`` by physical
    name (the protocol's rule), while every reader addresses columns by logical name. The
    names of the newest version are used: a physical name never changes, a logical one may
    (RENAME COLUMN), and rows are read as the range's end names them.

    A ``remove`` may leave its ``partitionValues`` out (optional in the protocol: Delta-Spark's
    DML on a table with deletion vectors writes ``{}``); its rows are still the file's, so
    they are the file's ``add``'s, in the same commit or else in the version before."""
    actions = change_log(snap, v).actions
    if snap.table is not None and snap.partition_columns:
        actions = _removes_with_partitions(snap, v, actions)
    if snap.column_mapping == "none":
        return actions
    logical = {p: name for name, p in snap.physical_names.items()}
    return [{kind: _logical_partitions(body, logical) if kind in ("cdc", "add", "remove")
             else body for kind, body in a.items()} for a in actions]


def _removes_with_partitions(snap: TableVersion, v: int, actions: list[dict]) -> list[dict]:
    """``actions`` with each ``remove`` that names no partition values given its file's."""
    bare = {unquote(a["remove"]["path"]) for a in actions
            if "remove" in a and not a["remove"].get("partitionValues")}
    if not bare:
        return actions
    known = {unquote(a["add"]["path"]): a["add"]["partitionValues"] for a in actions
             if "add" in a and unquote(a["add"]["path"]) in bare
             and a["add"].get("partitionValues")}
    if bare - set(known):
        before = TableVersion.load(snap.uri, v - 1, snap.storage_options).add_actions
        for path in bare - set(known):
            if not (before.get(path) or {}).get("partitionValues"):
                raise StorageMismatch(
                    f"{snap.uri} version {v} removes {path} without its partition values, "
                    f"and version {v - 1} has no such file to take them from: the log is not "
                    "one this layer understands; stop and report it")
            known[path] = before[path]["partitionValues"]
    return [{"remove": {**a["remove"], "partitionValues": known[unquote(a["remove"]["path"])]}}
            if "remove" in a and unquote(a["remove"]["path"]) in bare else a for a in actions]


def _logical_partitions(action: dict, logical: Mapping[str, str]) -> dict:
    values = action.get("partitionValues")
    if not values:
        return action
    return {**action, "partitionValues": {logical.get(k, k): v for k, v in values.items()}}


def change_log(snap: TableVersion, v: int) -> ChangeLog:
    """Commit ``v`` parsed once per process: a catch-up in steps reads the same commits once
    per step, which would otherwise parse each of them again. Keyed by the table's id: a table
    recreated at the same uri is read afresh."""
    if snap.table is None:  # no table id to key on (a bare look at the log): not kept
        return _parsed(snap, v)
    key = (snap.uri, snap.table.metadata().id, v)
    found = _LOGS.get(key)
    if found is None:
        found = _parsed(snap, v)
        _LOGS.put(key, found)
    return found


_LOGS: LRU[tuple, ChangeLog] = LRU(64, name="parsed change logs")
_KEPT_FIELDS = ("path", "partitionValues", "size", "deletionVector", "dataChange")


def _parsed(snap: TableVersion, v: int) -> ChangeLog:
    actions = []
    rows = None
    timestamp = None
    for a in _raw_actions(snap, v):
        if "commitInfo" in a:
            info = a["commitInfo"]
            timestamp = info.get("inCommitTimestamp", info.get("timestamp"))
            rows = _metric_rows(info.get("operationMetrics") or {})
        elif "metaData" in a:
            actions.append({"metaData": True})
        for kind in ("cdc", "add", "remove"):
            if kind in a:
                actions.append({kind: {k: a[kind][k] for k in _KEPT_FIELDS if k in a[kind]}})
    if timestamp is None:  # commitInfo is optional: the protocol's time is the file's mtime
        timestamp = commit_file_millis(snap.uri, v, snap.storage_options)
    actions.append({"commitInfo": {"timestamp": int(timestamp)}})
    return ChangeLog(actions, rows)


def commit_file_millis(uri: str, v: int, storage_options: Mapping[str, str] | None) -> int:
    """The commit time of a version whose commit records none (no ``commitInfo``, or one
    without a timestamp: both allowed by the protocol): its commit file's modification time,
    which is what the protocol names as a commit's timestamp without in-commit timestamps."""
    found = objects.stat(commit_uri(uri, v), storage_options)
    return 0 if found is None else found[1] // 1_000_000


def _metric_rows(metrics: Mapping[str, object]) -> int | None:
    """Change rows by a commit's metrics (delta-rs and Spark names): inserted + deleted + 2 x
    updated; None when it records none of them."""
    flat = {k.replace("_", "").lower(): v for k, v in metrics.items()}
    found = [(weight, flat[name]) for weight, names in _METRICS for name in names
             if isinstance(flat.get(name), (int, float, str)) and str(flat[name]).isdigit()]
    return sum(weight * int(n) for weight, n in found) if found else None


_METRICS = ((1, ("numtargetrowsinserted", "numaddedrows")),
            (1, ("numtargetrowsdeleted", "numdeletedrows")),
            (2, ("numtargetrowsupdated", "numupdatedrows")))


def _raw_actions(snap: TableVersion, v: int) -> list[dict]:
    """The commit's actions; without its ``add`` and ``remove`` lines when it has change files
    (see the module docstring). An action line is an object of one key, its kind."""
    try:
        raw = objects.read_bytes(commit_uri(snap.uri, v), snap.storage_options)
    except (FileNotFoundError, OSError):
        raise HistoryUnavailable(
            f"changes of {snap.uri} are no longer available: version {v} is no longer in the "
            "table's log (log retention cleaned it up); rebuild from a later version or keep "
            "history longer (delta.logRetentionDuration)") from None
    lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    kinds = [_kind(line) for line in lines]
    skipped = {"add", "remove"} if "cdc" in kinds else set()
    return [json.loads(line) for line, kind in zip(lines, kinds, strict=True)
            if kind not in skipped]


_KIND = re.compile(r'\s*\{\s*"([A-Za-z]+)"\s*:')


def _kind(line: str) -> str | None:
    """The kind of an action line (None: not one this reader recognises: parsed whole)."""
    found = _KIND.match(line)
    return found.group(1) if found else None
