"""A step judges whether compaction is due from the version it committed on and what it
committed (`maintain.compaction_due`), without loading the new version. For generated
histories of keyed commits (deletes, updates and inserts over a few vnodes, files of a few
rows) the answer equals the one `compact` reads from the loaded new version, for every vnode
span. No Spark: the commits are the driver's.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.storage import Intent, KeyedRows, TableVersion, apply_keyed, ensure_mor_table
from backfill_assets.storage.delta.prune import files_within_vnodes
from backfill_assets.storage.writes import maintain

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("vnode", pa.int32())])
VNODES = 4


def _rows(ids, name: str) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": name, "vnode": i % VNODES} for i in ids],
                                schema=SCHEMA)


def _due_on_the_new_version(uri: str, vnodes: list[int]) -> bool:
    snap = TableVersion.load(uri)
    chosen = maintain.files_to_compact(files_within_vnodes(snap.files, vnodes), False)
    return len(chosen) >= 2 or any(f.deletion_vector for f in chosen)


commit_steps = st.lists(st.tuples(
    st.lists(st.integers(0, 59), max_size=12, unique=True),  # keys deleted or updated
    st.booleans(),  # update (True) or delete
    st.integers(0, 6),  # new keys inserted
    st.integers(1, 8)), min_size=1, max_size=8)  # rows per new file


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=commit_steps, small_files=st.sampled_from([2, 32]))
def test_the_judgement_from_the_change_equals_the_loaded_versions(tmp_path_factory, steps,
                                                                  small_files, monkeypatch):
    monkeypatch.setattr(maintain, "MAX_SMALL_FILES", small_files)
    uri = str(tmp_path_factory.mktemp("due") / "mv")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    seed = _rows(range(60), "seed")
    apply_keyed(TableVersion.load(uri), ["id"], Intent({"t/mv/0": 0}),
                KeyedRows(seed.slice(0, 0), seed), file_rows=10)
    held = {i: "seed" for i in range(60)}
    next_id = 60
    for n, (keys, update, inserts, file_rows) in enumerate(steps, start=1):
        keys = [k for k in keys if k in held]
        before = _rows([], "")
        if keys:
            before = pa.concat_tables([_rows([k], held[k]) for k in keys])
        new = list(range(next_id, next_id + inserts))
        next_id += inserts
        after = pa.concat_tables([_rows(keys if update else [], f"v{n}"), _rows(new, f"v{n}")])
        snap = TableVersion.load(uri)
        applied = apply_keyed(snap, ["id"], Intent({"t/mv/0": n}), KeyedRows(before, after),
                              file_rows=file_rows)
        for k in keys:
            if update:
                held[k] = f"v{n}"
            else:
                del held[k]
        held.update({i: f"v{n}" for i in new})
        for span in ([0, 1, 2, 3], [0, 1], [2, 3], [1]):
            assert maintain.compaction_due(snap, applied, span) == \
                _due_on_the_new_version(uri, span), (n, span)


def test_a_few_deletes_are_not_due_and_a_quarter_of_a_file_is(tmp_path):
    uri = str(tmp_path / "mv")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    seed = _rows(range(40), "seed")  # 4 files of 10 rows, one per vnode
    apply_keyed(TableVersion.load(uri), ["id"], Intent({"t/mv/0": 0}),
                KeyedRows(seed.slice(0, 0), seed), file_rows=10)
    for deleted, due in (([0], False), ([4, 8, 12], True)):  # vnode 0: 1 of 10, then 4 of 10
        snap = TableVersion.load(uri)
        applied = apply_keyed(snap, ["id"], Intent({"t/mv/0": 1}),
                              KeyedRows(_rows(deleted, "seed"), _rows([], "")))
        assert maintain.compaction_due(snap, applied, [0, 1, 2, 3]) is due
        assert _due_on_the_new_version(uri, [0, 1, 2, 3]) is due


def test_a_commit_over_another_writers_is_judged_on_the_loaded_version(tmp_path):
    uri = str(tmp_path / "mv")
    ensure_mor_table(uri, SCHEMA, None, cdf=True, configuration={"backfill.vnodeCount": "4"})
    old = TableVersion.load(uri)
    rows = _rows([1], "a")
    apply_keyed(TableVersion.load(uri), ["id"], Intent({"t/mv/0": 0}), KeyedRows(rows.slice(0, 0),
                                                                              rows))
    applied = apply_keyed(old, ["id"], Intent({"t/mv/1": 0}),
                          KeyedRows(rows.slice(0, 0), _rows([2], "b")))
    assert applied.version == old.version + 2  # rebased over the other commit
    assert maintain.compaction_due(old, applied, [0, 1, 2, 3])
