"""``storage.replace_keyed``: the rows of a few keys overwritten in one commit that costs what it
writes (the progress table's write), checked against a dict model over generated sequences of
overwrites, including two writers planned on the same version over disjoint keys. No Spark."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.storage import Intent, TableVersion, ensure_mor_table, replace_keyed

SCHEMA = pa.schema([("vnode", pa.int32()), ("pos", pa.int64()), ("note", pa.string())])
VNODES = 16

_subsets = st.lists(st.integers(0, VNODES - 1), min_size=1, max_size=VNODES, unique=True)
# a vnode replaced by a row, or left without one (a reset: its row goes)
_step = st.tuples(_subsets, st.integers(0, 1000), st.booleans())


def _rows(vnodes: list[int], pos: int, drop_odd: bool) -> pa.Table:
    kept = [v for v in vnodes if not (drop_odd and v % 2)]
    return pa.table({"vnode": kept, "pos": [pos + v for v in kept],
                     "note": [f"v{v}@{pos}" for v in kept]}, schema=SCHEMA)


def _replace(uri: str, snap: TableVersion, vnodes: list[int], rows: pa.Table, app: str) -> int:
    keys = pa.table({"vnode": pa.array(sorted(vnodes), pa.int32())})
    intent = Intent({f"{app}/{v}": 1 for v in vnodes})
    return replace_keyed(snap, ["vnode"], intent, keys, rows).version


def _held(uri: str) -> dict[int, tuple]:
    rows = pa.table(DeltaTable(uri).scan()).to_pylist()  # delta-rs' DV-aware scan
    assert len({r["vnode"] for r in rows}) == len(rows), "two rows for one vnode"
    return {r["vnode"]: (r["pos"], r["note"]) for r in rows}


@settings(max_examples=25, deadline=None)
@given(st.lists(_step, min_size=1, max_size=8), _subsets)
def test_replaced_rows_are_exactly_the_model(tmp_path_factory, steps, other):
    uri = str(tmp_path_factory.mktemp("progress") / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=False)
    model: dict[int, tuple] = {}
    for vnodes, pos, drop_odd in steps:
        rows = _rows(vnodes, pos, drop_odd)
        _replace(uri, TableVersion.load(uri), vnodes, rows, "a")
        for v in vnodes:
            model.pop(v, None)
        model.update({r["vnode"]: (r["pos"], r["note"]) for r in rows.to_pylist()})
        assert _held(uri) == model
    # two writers planned on the same version over disjoint vnodes: both land, rebased
    base = TableVersion.load(uri)
    first = sorted(set(range(VNODES)) - set(other))
    for vnodes, app in ((first, "b"), (other, "c")):
        if vnodes:
            rows = _rows(vnodes, 5000, False)
            _replace(uri, base, vnodes, rows, app)
            model.update({r["vnode"]: (r["pos"], r["note"]) for r in rows.to_pylist()})
    assert _held(uri) == model
    live = TableVersion.load(uri).files
    assert len(live) <= len(steps) + 2  # one file per commit at most, replaced files go


def test_a_full_overwrite_removes_the_old_file_instead_of_marking_it(tmp_path):
    uri = str(tmp_path / "t")
    ensure_mor_table(uri, SCHEMA, None, cdf=False)
    for pos in range(3):
        _replace(uri, TableVersion.load(uri), list(range(VNODES)),
                 _rows(list(range(VNODES)), pos, False), "a")
    files = TableVersion.load(uri).files
    assert len(files) == 1 and not files[0].deletion_vector
    assert DeltaTable(uri).transaction_version("a/3") == 1


def test_a_table_a_racing_run_just_created_is_upgraded_before_use(tmp_path):
    """Another run created the progress table (version 0) and has not enabled DVs yet: the
    table handed to this run has them, so its commit is not planned on version 0 and refused
    later as a concurrent protocol change (a disjoint-vnodes race of CI)."""
    from backfill_assets.mv import owned_tables

    uri = str(tmp_path / "progress")
    DeltaTable.create(uri, SCHEMA, configuration={"delta.enableChangeDataFeed": "false"})
    table = owned_tables.ensure_table(uri, SCHEMA, {}, cdf=False)
    assert "deletionVectors" in (table.protocol().reader_features or [])
    version = _replace(uri, TableVersion(uri, {}, table), [1, 2], _rows([1, 2], 7, False), "a")
    assert version == table.version() + 1 and _held(uri) == {1: (8, "v1@7"), 2: (9, "v2@7")}
