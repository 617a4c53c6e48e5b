"""Generated Delta logs that exercise what foreign writers do and the protocol allows: a file's
deletion vector changing in any direction between versions (grown, shrunk, dropped, swapped,
the file removed and added back as a RESTORE does), column mapping with physical names in the
files and in ``partitionValues``, commits without ``commitInfo``, and ``remove`` actions
without ``partitionValues`` (optional in the protocol; Delta-Spark's DML on a table with DVs
writes ``{}``).

The oracle is the live rows of each version computed here from the generated history (the
file's rows minus its DV at that version): the change feed the storage layer reads for a
version must be exactly the difference between the live rows before and after it, and the
version read must be exactly the live rows. No Spark: the logs are written as JSON lines.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from backfill_assets.storage.delta import dv, log_head
from backfill_assets.storage.delta.log import TableVersion
from backfill_assets.storage.rows import change_range
from backfill_assets.storage.rows.change_feed import read_change_range
from backfill_assets.storage.rows.scan import file_rows

ROWS = 8  # rows per file
FILES = 3


def _field(name: str, type_: str, mapped: bool, fid: int) -> dict:
    meta = {"delta.columnMapping.id": fid, "delta.columnMapping.physicalName": f"col-{fid}-x"}
    return {"name": name, "type": type_, "nullable": True, "metadata": meta if mapped else {}}


class Log:
    """A Delta table written action by action: files of ``ROWS`` rows (id, v, part)."""

    def __init__(self, root: str, mapped: bool, commit_info: bool, bare_removes: bool = False):
        self.root, self.mapped, self.commit_info = root, mapped, commit_info
        self.bare_removes = bare_removes  # removes without partitionValues (Delta-Spark's DML)
        self.version = -1
        self.live: dict[str, BitMap64] = {}  # path -> its DV now
        self.rows: dict[str, pa.Table] = {}  # path -> its logical rows
        self.descriptors: dict[str, dict | None] = {}  # path -> its DV's descriptor now
        os.makedirs(os.path.join(root, "_delta_log"))
        fields = [_field("id", "long", mapped, 1), _field("v", "string", mapped, 2),
                  _field("part", "string", mapped, 3)]
        self.physical = {f["name"]: (f"col-{i + 1}-x" if mapped else f["name"])
                         for i, f in enumerate(fields)}
        features = ["deletionVectors"] + (["columnMapping"] if mapped else [])
        config = {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}
        if mapped:
            config |= {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "3"}
        self.commit([
            {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                          "readerFeatures": features,
                          "writerFeatures": [*features, "changeDataFeed"]}},
            {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet",
                                                               "options": {}},
                          "schemaString": json.dumps({"type": "struct", "fields": fields}),
                          "partitionColumns": ["part"], "configuration": config,
                          "createdTime": 1}}])

    def commit(self, actions: list[dict]) -> None:
        self.version += 1
        if self.commit_info:
            actions = [{"commitInfo": {"timestamp": 1_700_000_000_000 + self.version,
                                       "operation": "WRITE"}}, *actions]
        path = os.path.join(self.root, "_delta_log", f"{self.version:020d}.json")
        with open(path, "w") as f:
            f.write("".join(json.dumps(a) + "\n" for a in actions))

    def new_file(self, n: int) -> dict:
        part = f"p{n % 2}"
        ids = list(range(n * ROWS, (n + 1) * ROWS))
        logical = pa.table({"id": pa.array(ids, pa.int64()),
                            "v": pa.array([f"r{i}" for i in ids], pa.string())})
        path = f"part={part}/f{n}.parquet"
        os.makedirs(os.path.join(self.root, f"part={part}"), exist_ok=True)
        pq.write_table(logical.rename_columns([self.physical["id"], self.physical["v"]]),
                       os.path.join(self.root, path))
        self.rows[path] = logical.append_column("part", pa.array([part] * ROWS, pa.string()))
        return self._add(path, BitMap64())

    def _add(self, path: str, deleted: BitMap64) -> dict:
        add = {"path": path, "partitionValues": {self.physical["part"]: path[5:7]},
               "size": os.path.getsize(os.path.join(self.root, path)),
               "modificationTime": 1, "dataChange": True,
               "stats": json.dumps({"numRecords": ROWS})}
        if len(deleted):
            file = dv.encode_file([deleted])
            with open(os.path.join(self.root, file.relative_path), "wb") as f:
                f.write(file.data)
            add["deletionVector"] = file.descriptors[0]
        self.live[path] = deleted
        self.descriptors[path] = add.get("deletionVector")
        return {"add": add}

    def _remove(self, path: str) -> dict:
        old = self.live.pop(path)
        rm = {"path": path, "deletionTimestamp": 1, "dataChange": True,
              "partitionValues": {} if self.bare_removes else {self.physical["part"]: path[5:7]},
              "size": 1}
        if len(old):  # a remove repeats the DV the file had
            rm["deletionVector"] = self.descriptors[path]
        return {"remove": rm}

    def with_dv(self, path: str, deleted: BitMap64) -> list[dict]:
        """The file removed and added again with ``deleted`` as its DV (any direction)."""
        rm = self._remove(path)
        add = self._add(path, deleted)
        return [rm, add]

    def live_rows(self) -> pa.Table:
        keep = [self.rows[p].filter(pa.array([i not in d for i in range(ROWS)]))
                for p, d in sorted(self.live.items())]
        return pa.concat_tables([self.rows_schema().empty_table(), *keep])

    def rows_schema(self) -> pa.Schema:
        return pa.schema([("id", pa.int64()), ("v", pa.string()), ("part", pa.string())])


def _counted(table: pa.Table) -> Counter:
    return Counter(tuple(sorted(r.items())) for r in table.to_pylist())


@st.composite
def histories(draw):
    """Versions after the first: each changes some files' DVs in any direction, removes a
    file, or adds back a removed one with an older DV (as RESTORE does)."""
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["dv", "dv", "dv", "remove", "restore"]))
        n = draw(st.integers(0, FILES - 1))
        rows = draw(st.sets(st.integers(0, ROWS - 1), max_size=ROWS))
        steps.append((kind, n, sorted(rows)))
    return steps


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(), mapped=st.booleans(), commit_info=st.booleans(),
       bare_removes=st.booleans())
def test_every_version_and_its_changes_match_the_history(tmp_path_factory, history, mapped,
                                                         commit_info, bare_removes):
    root = str(tmp_path_factory.mktemp("log"))
    log = Log(root, mapped, commit_info, bare_removes)
    log.commit([log.new_file(n) for n in range(FILES)])
    removed: dict[str, BitMap64] = {}
    states = [log.live_rows()]
    for kind, n, rows in history:
        path = next(p for p in log.rows if p.endswith(f"/f{n}.parquet"))
        if kind == "dv" and path in log.live and (rows or len(log.live[path])):
            # (both without a DV would add and remove the same (path, DV id) in one version,
            # which the protocol forbids)
            actions = log.with_dv(path, BitMap64(rows))
        elif kind == "remove" and path in log.live:
            removed[path] = log.live[path]
            actions = [log._remove(path)]
        elif kind == "restore" and path in removed:
            actions = [log._add(path, removed.pop(path))]
        else:
            continue
        log.commit(actions)
        states.append(log.live_rows())
    snap = TableVersion.load(root)
    assert snap.version == log.version == len(states)
    logical = log.rows_schema()
    physical = {c: snap.physical_names.get(c, c) for c in ("id", "v")}
    for version in range(1, log.version + 1):
        at = TableVersion.load(root, version)
        read = pa.concat_tables([logical.empty_table()] + [
            file_rows(at.file_uri(f.path), {}, physical, logical,
                      deleted=dv.load(root, f.deletion_vector, {}),
                      partition=pa.table({"part": [f.partition_values["part"]]}))
            for f in at.files])
        assert _counted(read) == _counted(states[version - 1]), version
    for version in range(2, log.version + 1):
        changes = read_change_range(snap, version - 1, version)
        before, after = _counted(states[version - 2]), _counted(states[version - 1])
        got_in = _counted(changes.filter(pa.compute.equal(changes["_change_type"], "insert"))
                          .select(["id", "v", "part"]))
        got_out = _counted(changes.filter(pa.compute.equal(changes["_change_type"], "delete"))
                           .select(["id", "v", "part"]))
        assert got_in == after - before, (version, history)
        assert got_out == before - after, (version, history)


@pytest.mark.parametrize("commit_info", [True, False])
def test_commit_times_without_commit_info(tmp_path, commit_info):
    """Every commit has a time, whether or not it carries commitInfo (the protocol allows
    none): the history and the change feed's _commit_timestamp take the commit file's."""
    log = Log(str(tmp_path / "t"), True, commit_info)
    log.commit([log.new_file(0)])
    log.commit(log.with_dv("part=p0/f0.parquet", BitMap64([1, 2])))
    head = log_head.open_head(log.root, log.version)
    stamps = [h["timestamp"] for h in head.history()]
    assert len(stamps) == 3 and all(isinstance(s, int) and s > 0 for s in stamps)
    changes = change_range.read_raw_changes(log.root, 1, 2)
    assert changes.num_rows == 2
    assert changes["_commit_timestamp"].null_count == 0
    assert changes["_commit_timestamp"][0].value > 0
