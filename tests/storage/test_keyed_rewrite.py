"""A keyed commit may rewrite a small table whole from the rows its caller holds
(``keyed_rewrite``, ``apply_keyed(whole=...)``) instead of giving its files DVs. For generated
histories of barriers (updates, deletes, inserts and unchanged rows over a string key, some
commits given the held rows and some not, so both paths interleave on one table) the table
read fresh by delta-rs after every commit is the held rows, row for row, and each version's
change feed, read by delta-rs and by the layer's own reader, is exactly the barrier's change.
A held copy that is not the table (a row count off) takes the DV path, and a change the held
rows disagree with writes nothing. No Spark: the commits are the driver's.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import StorageMismatch
from backfill_assets.storage import (
    Intent,
    KeyedRows,
    TableVersion,
    apply_keyed,
    ensure_mor_table,
    read_raw_changes,
)
from backfill_assets.storage.rows import keyed_rewrite

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("vnode", pa.int32())])
KEY = ["k"]
VNODES = 4


def _rows(held: dict[str, int], keys) -> pa.Table:
    keys = sorted(keys)
    return pa.table({"k": keys, "n": [held[k] for k in keys],
                     "vnode": [sum(map(ord, k)) % VNODES for k in keys]}, schema=SCHEMA)


def _table(uri: str, seed: int) -> dict[str, int]:
    ensure_mor_table(uri, SCHEMA, None, cdf=True,
                     configuration={"backfill.vnodeCount": str(VNODES)})
    held = {f"g{i}": 0 for i in range(seed)}
    apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 0}),
                KeyedRows(SCHEMA.empty_table(), _rows(held, held)), file_rows=7)
    return held


def _fresh(uri: str) -> list[tuple]:
    rows = pa.table(DeltaTable(uri).scan()).to_pylist()  # delta-rs' read, DVs applied
    return sorted((r["k"], r["n"], r["vnode"]) for r in rows)


def _feed(uri: str, version: int) -> list[tuple]:
    ours = read_raw_changes(uri, version - 1, version).to_pylist()
    theirs = pa.table(DeltaTable(uri).load_cdf(starting_version=version,
                                               ending_version=version)).to_pylist()
    got = sorted((r["k"], r["n"], r["_change_type"]) for r in ours)
    assert got == sorted((r["k"], r["n"], r["_change_type"]) for r in theirs)
    return got


barriers = st.lists(st.tuples(
    st.lists(st.integers(0, 39), max_size=30, unique=True),  # keys touched (held or new)
    st.integers(0, 3),  # what a held key does: 0 delete, 1 unchanged, 2-3 update
    st.booleans()), min_size=1, max_size=6)  # the held rows given (a rewrite may run)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=barriers, seed=st.integers(0, 30))
def test_rewrites_and_dvs_interleaved_keep_the_table_and_its_feed_exact(tmp_path_factory,
                                                                      steps, seed):
    uri = str(tmp_path_factory.mktemp("rewrite") / "mv")
    held = _table(uri, seed)
    for n, (touched, held_does, give) in enumerate(steps, start=1):
        keys = [f"g{i}" for i in touched]
        old, new = {k: v for k, v in held.items() if k in keys}, dict(held)
        for k in keys:
            if k not in held:
                new[k] = n
            elif held_does == 0:
                del new[k]
            elif held_does > 1:
                new[k] = held[k] + n
        after = {k: new[k] for k in keys if k in new}
        expected = {(k, old[k], "update_preimage") for k in old if k in after
                    and after[k] != old[k]}
        expected |= {(k, after[k], "update_postimage") for k in old if k in after
                     and after[k] != old[k]}
        expected |= {(k, after[k], "insert") for k in after if k not in old}
        expected |= {(k, old[k], "delete") for k in old if k not in after}
        snap = TableVersion.load(uri)
        applied = apply_keyed(snap, KEY, Intent({"t/mv/0": n}),
                              KeyedRows(_rows(old, old), _rows(after, after)),
                              whole=_rows(held, held) if give else None)
        held = new
        assert _fresh(uri) == sorted((k, v, sum(map(ord, k)) % VNODES)
                                     for k, v in held.items()), n
        if applied.version is not None and expected:
            assert _feed(uri, applied.version) == sorted(expected), n
        if applied.rewrote:
            live = TableVersion.load(uri)
            assert not any(f.deletion_vector for f in live.files)
            commit = DeltaTable(uri).history(1)[0]
            assert commit[keyed_rewrite.COMMIT_KIND] == "rewrite"


def test_held_rows_that_are_not_the_table_take_the_dv_path(tmp_path):
    uri = str(tmp_path / "mv")
    held = _table(uri, 20)
    short = dict(list(held.items())[:19])  # a row missing: not the table
    changed = {k: 5 for k in list(held)[:10]}
    applied = apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 1}),
                          KeyedRows(_rows(held, changed), _rows(changed, changed)),
                          whole=_rows(short, short))
    assert not applied.rewrote and applied.rows_deleted == 10
    assert _fresh(uri) == sorted((k, changed.get(k, v), sum(map(ord, k)) % VNODES)
                                 for k, v in held.items())


def test_a_change_the_held_rows_disagree_with_writes_nothing(tmp_path):
    uri = str(tmp_path / "mv")
    held = _table(uri, 20)
    version = DeltaTable(uri).version()
    ghost = {"nope": 0, **{k: 0 for k in list(held)[:9]}}  # "nope" is not held
    later = {k: 1 for k in ghost}
    with pytest.raises(StorageMismatch, match="does not hold the row"):
        apply_keyed(TableVersion.load(uri), KEY, Intent({"t/mv/0": 1}),
                    KeyedRows(_rows(ghost, ghost), _rows(later, later)),
                    whole=_rows(held, held))
    assert DeltaTable(uri).version() == version
    assert keyed_rewrite.pays(20, 10)
