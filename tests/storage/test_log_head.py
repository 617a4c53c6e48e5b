"""A version's head read from the log (storage.log_head) equals delta-rs' own load of it.

Tables go through generated sequences of appends, overwrites, property changes, added
columns, checkpoints, deletes and a drop-and-recreate at the same uri; after each, every
version's head (read cold, and warm: brought forward from the newest head this process
holds) must agree with ``DeltaTable(uri, version)`` on version, metadata, schema, protocol
and history. Nothing here needs Spark.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import HistoryUnavailable
from backfill_assets.storage import clear_all
from backfill_assets.storage.delta.log_head import TableHead, open_head

OPS = st.lists(st.sampled_from(["append", "overwrite", "property", "add_column", "checkpoint",
                                "delete", "recreate"]), min_size=1, max_size=8)


def _rows(n: int, extra: bool) -> pa.Table:
    cols = {"id": pa.array(range(n), pa.int64()), "part": pa.array([i % 2 for i in range(n)],
                                                                   pa.int32())}
    if extra:
        cols["note"] = pa.array([f"n{i}" for i in range(n)])
    return pa.table(cols)


def _apply(uri: str, op: str, step: int, state: dict) -> None:
    if op == "recreate" or not state:
        shutil.rmtree(uri, ignore_errors=True)
        write_deltalake(uri, _rows(3, False), partition_by=["part"], name=f"t{step}",
                        description=f"made at step {step}",
                        configuration={"delta.enableChangeDataFeed": "true"})
        state.clear()
        state["extra"] = False
        return
    dt = DeltaTable(uri)
    if op == "append":
        write_deltalake(uri, _rows(2, state["extra"]), mode="append", schema_mode="merge")
    elif op == "overwrite":
        write_deltalake(uri, _rows(4, state["extra"]), mode="overwrite")
    elif op == "property":
        dt.alter.set_table_properties({"delta.logRetentionDuration": f"interval {step + 30} days"})
    elif op == "add_column":
        state["extra"] = True
        write_deltalake(uri, _rows(1, True), mode="append", schema_mode="merge")
    elif op == "checkpoint":
        dt.create_checkpoint()
    elif op == "delete":
        dt.delete("id = 0")


def _same(head, uri: str, version: int) -> None:
    dt = DeltaTable(uri, version=version)
    latest = DeltaTable(uri)
    assert isinstance(head, TableHead)
    assert head.version() == dt.version()
    a, b = head.metadata(), dt.metadata()
    assert (a.id, a.name, a.description, list(a.partition_columns), dict(a.configuration)) == \
        (b.id, b.name, b.description, list(b.partition_columns), dict(b.configuration))
    assert head.schema().to_json() == dt.schema().to_json()
    p, q = head.protocol(), dt.protocol()
    assert (p.min_reader_version, p.min_writer_version, sorted(p.reader_features or []),
            sorted(p.writer_features or [])) == \
        (q.min_reader_version, q.min_writer_version, sorted(q.reader_features or []),
         sorted(q.writer_features or []))
    # delta-rs 1.6.6's history of a time-travelled table lists the newest commits under the
    # loaded version's numbers, and pads a short one with version -1: compare with the
    # latest's, cut at this version
    for limit in (1, 3, None):
        ours = [(c["version"], c.get("operation")) for c in head.history(limit)]
        theirs = [(c["version"], c.get("operation")) for c in latest.history()
                  if 0 <= c["version"] <= version][:limit]
        assert ours == theirs


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
def test_a_head_equals_delta_rs_load_at_every_version(tmp_path_factory, ops):
    uri = str(tmp_path_factory.mktemp("head") / "t")
    state: dict = {}
    for step, op in enumerate(["create", *ops]):
        _apply(uri, op, step, state)
        latest = DeltaTable(uri).version()
        for v in range(latest + 1):  # warm: heads brought forward from the newest one held
            _same(open_head(uri, v), uri, v)
        clear_all()  # cold: from the last checkpoint, then the commits after it
        _same(open_head(uri, latest), uri, latest)


def test_a_missing_commit_falls_back_to_delta_rs(tmp_path):
    """Log cleanup removed the commits before a checkpoint: the head of a version the
    checkpoint covers still reads; an older one goes to delta-rs, which refuses it by name
    (HistoryUnavailable)."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(3, False))
    write_deltalake(uri, _rows(2, False), mode="append")
    DeltaTable(uri).create_checkpoint()
    (tmp_path / "t" / "_delta_log" / "00000000000000000000.json").unlink()
    clear_all()
    assert isinstance(open_head(uri, 1), TableHead)
    with pytest.raises(HistoryUnavailable, match="version 0"):
        open_head(uri, 0)
