"""A table version's metadata, protocol and commit history without its file list.

Loading a version through delta-rs replays every live file's add action (thousands of them on
a large upstream, a noticeable share of a small barrier per new version). Most of what a
barrier asks of the upstream at its new version is metadata: the schema, the configuration
(change feed on, pk, vnode count), the partition columns, the reader features, who wrote the
recent commits. ``TableHead`` answers that from the log's metaData and protocol actions
alone: the newest head this process read of the same table, brought forward by the commits
since (a warm loop of barriers reads each commit file once), else the last classic checkpoint
(its metaData and protocol columns only) and the commits after it.

A head offers the part of delta-rs' ``DeltaTable`` interface those callers use (``version``,
``metadata``, ``schema``, ``protocol``, ``history``, ``table_uri``), so the same code reads
either. Anything unexpected in the log (a missing commit file, a checkpoint kind this reader
does not know) makes ``open_head`` return delta-rs' own table instead: never a guessed head.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from deltalake import Schema

from backfill_assets.storage.delta.delta_rs import open_table
from backfill_assets.storage.delta.log import commit_uri, read_checkpoint
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU


@dataclass(frozen=True)
class HeadMetadata:
    """delta-rs' ``Metadata`` fields, from a metaData action."""

    id: str
    name: str | None
    description: str | None
    partition_columns: list[str]
    configuration: dict[str, str]
    created_time: int | None


@dataclass(frozen=True)
class HeadProtocol:
    """delta-rs' ``ProtocolVersions`` fields, from a protocol action."""

    min_reader_version: int
    min_writer_version: int
    reader_features: list[str] | None
    writer_features: list[str] | None


class TableHead:
    """One version of a table: metadata, protocol, schema and history, no files."""

    def __init__(self, uri: str, version: int, meta: Mapping, protocol: Mapping,
                 storage_options: Mapping[str, str]):
        self.table_uri, self._version = uri, version
        self._meta, self._protocol, self._options = dict(meta), dict(protocol), storage_options

    def version(self) -> int:
        return self._version

    def metadata(self) -> HeadMetadata:
        m = self._meta
        config = m.get("configuration") or {}
        if isinstance(config, list):  # a checkpoint's map column
            config = dict(config)
        return HeadMetadata(m["id"], m.get("name"), m.get("description"),
                            list(m.get("partitionColumns") or []),
                            {k: v for k, v in config.items() if v is not None},
                            m.get("createdTime"))

    def schema(self) -> Schema:
        return Schema.from_json(self._meta["schemaString"])

    def protocol(self) -> HeadProtocol:
        p = self._protocol
        return HeadProtocol(int(p["minReaderVersion"]), int(p["minWriterVersion"]),
                            p.get("readerFeatures"), p.get("writerFeatures"))

    def history(self, limit: int | None = None) -> list[dict]:
        """The commitInfo of the newest ``limit`` versions (all with a commit file when
        None), newest first, each with its ``version`` (as delta-rs' ``history``)."""
        first = 0 if limit is None else max(0, self._version - limit + 1)
        out = []
        for v in range(self._version, first - 1, -1):
            try:
                actions = _commit_actions(self.table_uri, v, self._options, ("commitInfo",))
            except OSError:
                break  # older commits were cleaned up: delta-rs stops there too
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            out.append({**info, "timestamp": _commit_millis(self.table_uri, v, info,
                                                            self._options), "version": v})
        return out


def _commit_millis(uri: str, v: int, info: Mapping, options: Mapping[str, str] | None) -> int:
    """A commit's time: its in-commit timestamp, else commitInfo's, else (a commit without
    commitInfo, which the protocol allows and Databricks' test tables have) its commit file's
    modification time, as the protocol says."""
    found = info.get("inCommitTimestamp", info.get("timestamp"))
    if found is not None:
        return int(found)
    stat = objects.stat(commit_uri(uri, v), options)
    return 0 if stat is None else stat[1] // 1_000_000


def open_head(uri: str, version: int, storage_options: Mapping[str, str] | None = None):
    """The head of ``version`` (see the module docstring), or delta-rs' table when the log
    holds anything this reader does not handle."""
    uri, options = uri.rstrip("/"), dict(storage_options or {})
    try:
        return _head(uri, version, options)
    except (OSError, _Unhandled):  # a missing commit file: delta-rs names the error
        return open_table(uri, version, options)


class _Unhandled(Exception):
    """Something in the log this reader does not interpret: use delta-rs."""


@dataclass
class _Known:
    version: int
    meta: dict
    protocol: dict
    identity: tuple | None  # size and mtime of that version's commit file


_HEADS: LRU[tuple, _Known] = LRU(32, name="table heads")


def _head(uri: str, version: int, options: dict) -> TableHead:
    key = (uri, tuple(sorted(options.items())))
    known = _HEADS.get(key, touch=False)
    if known is not None and (known.version > version
                              or _identity(uri, known.version, options) != known.identity):
        known = None  # an older version, or the table was recreated: start over
    if known is None:
        known = _from_checkpoint(uri, version, options)
    meta, protocol = dict(known.meta), dict(known.protocol)
    for v in range(known.version + 1, version + 1):
        for action in _commit_actions(uri, v, options, ("metaData", "protocol")):
            meta = action.get("metaData") or meta
            protocol = action.get("protocol") or protocol
    if not meta or not protocol:
        raise _Unhandled(f"{uri} v{version}: no metaData or protocol action found")
    ahead = _Known(version, meta, protocol, _identity(uri, version, options))
    _HEADS.put(key, ahead, replaces=lambda current: current.version <= version)
    return TableHead(uri, version, meta, protocol, options)


def _from_checkpoint(uri: str, version: int, options: dict) -> _Known:
    """metaData and protocol of the newest complete classic checkpoint at or before
    ``version`` (version -1 and nothing when there is none)."""
    at, rows = read_checkpoint(uri, version, options, ("metaData", "protocol"))
    meta: dict = {}
    protocol: dict = {}
    for row in rows:
        meta = _present(row.get("metaData")) or meta
        protocol = _present(row.get("protocol")) or protocol
    return _Known(at, meta, protocol, None)


def _present(action: dict | None) -> dict | None:
    """A checkpoint row's action without its null fields (None when the row has none)."""
    if not action:
        return None
    out = {k: v for k, v in action.items() if v is not None}
    return out or None


def _commit_actions(uri: str, version: int, options: Mapping[str, str],
                    kinds: tuple[str, ...]) -> list[dict]:
    """The actions of one commit whose kind is among ``kinds`` (lines that cannot hold one
    are not parsed: a partitioned table's commit has hundreds of add and remove lines)."""
    raw = objects.read_bytes(commit_uri(uri, version), options).decode("utf-8")
    out: list[dict] = []
    if not any(f'"{kind}"' in raw for kind in kinds):  # most commits: one scan of the text
        return out
    for line in raw.splitlines():
        if any(f'"{kind}"' in line for kind in kinds):
            action = json.loads(line)
            if any(kind in action for kind in kinds):
                out.append(action)
    return out


def _identity(uri: str, version: int, options: Mapping[str, str]) -> tuple | None:
    try:
        return objects.stat(commit_uri(uri, version), options)
    except OSError:
        return None
