"""A table version as the storage layer sees it: protocol, schema and live data files.

delta-rs replays the log for the schema, the configuration and each file's statistics and
typed partition values (``get_add_actions``). It exposes no deletion-vector descriptors, which
a reader needs (which rows of a file are deleted) and a writer needs (a ``remove`` must name
the exact logical file, path + DV id, it replaces). ``dv_descriptors`` replays that part of
the log itself (last checkpoint, then the JSON commits) and is cross-checked against
delta-rs' file list, so the two replays can never silently disagree.

Reader features the layer does not implement are refused by name (``check_readable``): a
silently wrong read is the one failure this layer must never have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import unquote as _unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from backfill_assets.core.errors import StorageMismatch, UnsupportedTableFeature
from backfill_assets.storage.delta import dv
from backfill_assets.storage.delta.delta_rs import (
    arrow_schema,
    column_identities,
    column_mapping,
    latest_version,
    open_table,
)
from backfill_assets.storage.delta.file_stats import FileStats, StatColumns, partition_values
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU, memoized

# a log path decoded once per process (thousands of files, several snapshots per barrier)
unquote = memoized("decoded log paths", 1 << 20)(_unquote)

# reader features whose meaning this layer implements (anything else is refused by name)
SUPPORTED_READER_FEATURES = frozenset({"deletionVectors", "columnMapping", "timestampNtz",
                                       "vacuumProtocolCheck"})
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_COMMIT = re.compile(r"^(\d{20})\.json$")


def log_uri(table_uri: str) -> str:
    return objects.join(table_uri, "_delta_log")


def commit_uri(table_uri: str, version: int) -> str:
    return objects.join(log_uri(table_uri), f"{version:020d}.json")


@dataclass(frozen=True)
class DataFile:
    """One live (logical) data file of a version."""

    path: str  # as in the log (relative to the table root, URL-encoded) or absolute
    size: int
    num_records: int | None  # physical rows (a DV does not change it)
    partition_values: dict  # typed, from the log
    stats: Mapping = field(default_factory=dict)  # (side, column) -> min/max (exact types)
    deletion_vector: dict | None = None
    add_action: dict | None = None  # the raw log entry (tables with DVs: what a remove repeats)

    @property
    def deleted(self) -> int:
        return int(self.deletion_vector["cardinality"]) if self.deletion_vector else 0

    @property
    def live_records(self) -> int | None:
        return None if self.num_records is None else self.num_records - self.deleted


@dataclass
class TableVersion:
    """One version of one table: what readers and writers of the layer work from."""

    uri: str
    storage_options: Mapping[str, str]
    table: DeltaTable

    @classmethod
    def load(cls, uri: str, version: int | None = None,
             storage_options: Mapping[str, str] | None = None) -> TableVersion:

        if version is None:  # the latest version, by a listing of the log: a version is
            version = latest_version(uri, storage_options)  # loaded once per process
        table = open_table(uri, version, storage_options)
        key = (uri.rstrip("/"), tuple(sorted((storage_options or {}).items())))
        known = _LOADED.get(key, valid=lambda s: s.table is table)  # the same pinned version
        if known is not None:
            return known
        snap = cls(uri.rstrip("/"), dict(storage_options or {}), table)
        if pa.table(table.get_add_actions(flatten=False)).num_rows <= _LOADED_FILES:
            _LOADED.put(key, snap)
        return snap

    @property
    def version(self) -> int:
        return self.table.version()

    @cached_property
    def configuration(self) -> dict[str, str]:
        return dict(self.table.metadata().configuration)

    @cached_property
    def partition_columns(self) -> list[str]:
        return list(self.table.metadata().partition_columns)

    @cached_property
    def reader_features(self) -> list[str]:
        return list(self.table.protocol().reader_features or [])

    @cached_property
    def has_deletion_vectors(self) -> bool:
        return "deletionVectors" in self.reader_features

    @cached_property
    def column_mapping(self) -> str:
        return column_mapping(self.table)

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """Logical columns with plain Arrow types (string, not string_view)."""

        return arrow_schema(self.table)

    @cached_property
    def physical_names(self) -> dict[str, str]:
        """Logical column -> the column name inside the parquet files."""
        return {name: physical for name, (_, physical) in column_identities(self.table).items()}

    def check_readable(self) -> None:
        """Refuse reader features (and column mapping modes) the layer cannot honour."""
        check_readable(self.uri, self.version, self.table)

    @property
    def live_rows(self) -> int:
        """Live rows by the log's counts (what sizes the files a writer makes)."""
        return sum(f.live_records or 0 for f in self.files)

    @cached_property
    def files(self) -> list[DataFile]:
        """The live data files, typed partition values from delta-rs, DVs replayed. Converted
        column by column; each file's statistics stay in delta-rs' Arrow table until a reader
        asks for a column (`FileStats`): a 12,800-file table's stats as Python values held
        66 MiB of the driver, its readers use the key and vnode columns only."""
        actions = pa.table(self.table.get_add_actions(flatten=True))
        replayed = self.add_actions if self.has_deletion_vectors else {}
        logical = {v: k for k, v in self.physical_names.items()}
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        records = (actions.column("num_records").to_pylist()
                   if "num_records" in actions.column_names else [None] * len(paths))
        parts = partition_values(actions, logical)
        stats = StatColumns(actions, logical)
        out = []
        for row, path in enumerate(paths):
            raw = replayed.get(unquote(path))
            out.append(DataFile(path, int(sizes[row]), records[row], parts[row],
                                FileStats(stats, row), (raw or {}).get("deletionVector"), raw))
        return out

    def file_uri(self, path: str) -> str:
        """Where a file of the log lives (relative paths are URL-encoded in the log)."""
        if "://" in path or path.startswith("/"):
            return path
        return objects.join(self.uri, unquote(path))

    def by_path(self) -> dict[str, DataFile]:
        return {f.path: f for f in self.files}

    @cached_property
    def add_actions(self) -> dict[str, dict]:
        """Replay add/remove actions (checkpoint + commits up to this version): the add entry
        of each live file, keyed by its decoded path; checked against delta-rs' live set."""
        live = self._replayed.live
        expected = {unquote(f["path"]) for f in
                    pa.table(self.table.get_add_actions(flatten=False)).select(["path"]).to_pylist()}
        if set(live) != expected:
            raise StorageMismatch(
                f"{self.uri} version {self.version}: the log replay found "
                f"{len(live)} live files, delta-rs {len(expected)} "
                f"(e.g. {sorted(set(live) ^ expected)[:3]}); the log is not one this layer "
                "understands: stop and report it")
        return live

    @cached_property
    def txn_versions(self) -> dict[str, int]:
        """Every application transaction of this version: app id -> its version (one log
        replay instead of one delta-rs lookup per app id)."""
        return self._replayed.txns

    @cached_property
    def _replayed(self) -> Replayed:
        """The log replayed up to this version: from the newest replay of the same table this
        process made at or before it (only the commits since are read: a warm loop of barriers
        reads each commit once), else from the last checkpoint."""
        key = (self.uri, self.table.metadata().id)
        known = _REPLAYS.get(key, touch=False)
        if known is None or known.version > self.version:
            known = Replayed(-1, {}, {})
            known.version = self._replay_checkpoint(known.live, known.txns)
        out = Replayed(known.version, dict(known.live), dict(known.txns))
        for v in range(known.version + 1, self.version + 1):
            raw = objects.read_bytes(commit_uri(self.uri, v), self.storage_options)
            for line in raw.decode("utf-8").splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                _apply(out.live, action.get("add"), action.get("remove"))
                txn = action.get("txn")
                if txn:
                    out.txns[txn["appId"]] = int(txn["version"])
        out.version = self.version
        _REPLAYS.put(key, Replayed(out.version, dict(out.live), dict(out.txns)),
                     replaces=lambda current: current.version <= out.version)
        return out

    def _replay_checkpoint(self, live: dict, txns: dict) -> int:
        """Load the newest classic checkpoint at or before this version; its version (-1)."""
        version, rows = read_checkpoint(self.uri, self.version, self.storage_options,
                                        ("add", "remove", "txn"))
        for row in rows:
            _apply(live, _clean(row.get("add")), None)
            if row.get("txn"):
                txns[row["txn"]["appId"]] = int(row["txn"]["version"])
        return version


def read_checkpoint(uri: str, version: int, storage_options: Mapping[str, str],
                    columns: tuple[str, ...]) -> tuple[int, list[dict]]:
    """The rows (``columns`` that exist) of the newest complete classic checkpoint at or
    before ``version`` and its version; (-1, []) when there is none."""
    parts: dict[int, list[str]] = {}
    for n in objects.list_names(log_uri(uri), storage_options):
        m = _CHECKPOINT.match(n)
        if m and int(m.group(1)) <= version:
            parts.setdefault(int(m.group(1)), []).append(n)
    complete = [v for v, ns in parts.items() if _complete(ns)]
    if not complete:
        return -1, []
    at = max(complete)
    rows: list[dict] = []
    for name in sorted(parts[at]):
        fs, path = objects.filesystem(objects.join(log_uri(uri), name), storage_options)
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            wanted = [c for c in columns if c in pf.schema_arrow.names]
            rows += pf.read(columns=wanted).to_pylist()
    return at, rows


@dataclass
class Replayed:
    """What a replay of a table's log up to ``version`` found."""

    version: int
    live: dict[str, dict]  # decoded path -> add action
    txns: dict[str, int]  # app id -> version


# (table uri, storage options) -> the TableVersion last loaded (``TableVersion.load``):
# a barrier loads the replica's latest version two or three times, and each new TableVersion
# converted its file list again (a cost per file); tables of more files are not kept
# (their file lists are what a driver's memory must not hold on to)
_LOADED: LRU[tuple, TableVersion] = LRU(4, name="loaded table versions")
_LOADED_FILES = 10_000

# (table uri, table id) -> the newest replay this process made (a table recreated at the same
# uri has a new id); each TableVersion copies it, so nothing shared is ever changed
_REPLAYS: LRU[tuple[str, str], Replayed] = LRU(32, name="replayed logs")


def _apply(live: dict, add: dict | None, remove: dict | None) -> None:
    if remove:
        path = unquote(remove["path"])
        current = (live.get(path) or {}).get("deletionVector")
        if path in live and dv.unique_id(current) == dv.unique_id(remove.get("deletionVector")):
            del live[path]
    if add:
        live[unquote(add["path"])] = add


def _complete(names: list[str]) -> bool:
    """A single-file checkpoint, or every part of a multi-part one."""
    total = _CHECKPOINT.match(names[0]).group(3)
    return len(names) == (int(total) if total else 1)


def _clean(add: dict | None) -> dict | None:
    """A checkpoint's add row as the JSON action it stands for (maps as dicts, no nulls)."""
    if add is None:
        return None
    out = {k: v for k, v in add.items() if v is not None}
    if isinstance(out.get("partitionValues"), list):
        out["partitionValues"] = dict(out["partitionValues"])
    if out.get("deletionVector"):
        out["deletionVector"] = {k: v for k, v in out["deletionVector"].items() if v is not None}
    for nested in ("stats_parsed", "partitionValues_parsed", "tags"):
        out.pop(nested, None)
    return out


def check_readable(uri: str, version: int, table) -> None:
    """Refuse, with UnsupportedTableFeature, a table version (a DeltaTable or a log head: its
    protocol, schema and configuration) whose reader features or column mapping mode the
    layer cannot honour. Called on the upstream's head before a step writes anything, and by
    every read of a version."""
    unknown = sorted(set(table.protocol().reader_features or []) - SUPPORTED_READER_FEATURES)
    if '"variant"' not in table.schema().to_json():
        # delta-rs switches this feature on with any property change; without a variant
        # column there is nothing a reader must do for it
        unknown = [f for f in unknown if not f.startswith("variantType")]
    if unknown:
        raise UnsupportedTableFeature(
            f"{uri} (version {version}) needs reader features {unknown}, which the "
            "platform's Delta reader does not implement; reading it anyway could return wrong "
            "rows. Rewrite the table without them (or disable them) first"
        )
    mode = column_mapping(table)
    if mode not in ("none", "name", "id"):
        raise UnsupportedTableFeature(
            f"{uri} uses column mapping mode {mode!r}; supported: none, name, id")
