"""The change-feed reader: netted changes per key for a version range and a set of vnodes,
checked against a brute force built from time-travel snapshots; and the named errors for a
history that is gone (CDF off, vacuumed, out of range)."""

from __future__ import annotations

import datetime as dt
import glob
import os
import random
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from backfill_assets import storage
from backfill_assets.core.errors import (
    ChangeFeedDisabled,
    HistoryUnavailable,
    InvalidVersionRange,
)
from backfill_assets.core.names import OP
from backfill_assets.core.vnode import vnode_of
from backfill_assets.storage.rows import change_range
from backfill_assets.upstream.writer import DmlBatch, UpstreamSpec, apply_dml, create_upstream

UTC = dt.timezone.utc
VNODES = 8
COLUMNS = {"region": "string", "id": "bigint", "v": "string", "amt": "decimal(10,2)",
           "ts": "timestamp", "day": "date"}
SPEC = UpstreamSpec("orders", COLUMNS, ("region", "id"), VNODES)
REGIONS = ["eu", "us", "日本"]
T0 = dt.datetime(1965, 1, 1, tzinfo=UTC)


def make_row(rng: random.Random, key: tuple) -> dict:
    return {"region": key[0], "id": key[1], "v": f"v{rng.randrange(1000)}",
            "amt": Decimal(rng.randrange(-99999, 99999)).scaleb(-2),
            "ts": T0 + dt.timedelta(microseconds=rng.randrange(10**16)),
            "day": dt.date(1950, 1, 1) + dt.timedelta(days=rng.randrange(40000))}


def random_history(uri: str, seed: int, versions: int) -> None:
    """Random batches over a small key space so keys die, come back and move between
    vnodes (pk changes to previously deleted keys, and back and forth)."""
    rng = random.Random(seed)
    create_upstream(uri, SPEC)
    space = [(r, i) for r in REGIONS for i in range(12)]
    live: set = set()
    for _ in range(versions):
        ins, upd, dele, ups, pkc = [], [], [], [], []
        used: set = set()
        for _ in range(rng.randint(1, 10)):
            op = rng.choice(["insert", "update", "delete", "upsert", "pk_change", "pk_change"])
            free = [k for k in space if k not in live and k not in used]
            alive = [k for k in sorted(live) if k not in used]
            if op in ("insert", "upsert") and free:
                k = rng.choice(free)
                (ins if op == "insert" else ups).append(make_row(rng, k))
                live.add(k)
                used.add(k)
            elif op == "update" and alive:
                k = rng.choice(alive)
                (upd if rng.random() < 0.5 else ups).append(make_row(rng, k))
                used.add(k)
            elif op == "delete" and alive:
                k = rng.choice(alive)
                dele.append(k)
                live.discard(k)
                used.add(k)
            elif op == "pk_change" and alive and free:
                old, new = rng.choice(alive), rng.choice(free)
                pkc.append((old, make_row(rng, new)))
                live.discard(old)
                live.add(new)
                used.update((old, new))
        apply_dml(uri, DmlBatch(inserts=ins, updates=upd, deletes=dele, upserts=ups,
                                pk_changes=pkc), spec=SPEC)


def _norm(v):
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC)
    return v


def _rows(table: pa.Table, key=("region", "id")) -> dict:
    out = {}
    for r in table.to_pylist():
        out[tuple(r[k] for k in key)] = {c: _norm(r[c]) for c in COLUMNS}
    return out


def snapshot(uri: str, version: int, vnodes) -> dict:
    if version < 0:
        return {}
    t = storage.read_table(uri, version)
    return {k: r for k, r in _rows(t).items()
            if vnodes is None or vnode_of(k, SPEC.key_types, VNODES) in vnodes}


def assert_matches_brute_force(spark, uri: str, start: int, end: int, vnodes) -> int:
    from backfill_assets.engine.netting import read_changes

    net = read_changes(spark, uri, start, end, vnodes, ["region", "id"], VNODES).toArrow()
    got = {(r["region"], r["id"]): r for r in net.to_pylist()}
    assert len(got) == net.num_rows, "one row per key"
    before, after = snapshot(uri, start, vnodes), snapshot(uri, end, vnodes)
    # the last version each key changed in, from the raw feed
    raw = change_range.read_raw_changes(uri, start, end).to_pylist()
    last = {}
    for r in raw:
        k = (r["region"], r["id"])
        if vnodes is None or vnode_of(k, SPEC.key_types, VNODES) in vnodes:
            last[k] = max(last.get(k, -1), r["_commit_version"])
    assert set(got) == set(last)
    for k in set(before) | set(after) | set(got):
        if k not in got:
            assert before.get(k) == after.get(k), k
            continue
        r = got[k]
        assert r["_commit_version"] == last[k]
        assert r["vnode"] == vnode_of(k, SPEC.key_types, VNODES)
        if r[OP] == "upsert":
            assert k in after and {c: _norm(r[c]) for c in COLUMNS} == after[k], k
        else:
            assert r[OP] == "delete" and k not in after, k
    return len(got)


@pytest.mark.spark
def test_read_changes_matches_brute_force(spark, warehouse):
    uri = os.path.join(warehouse, "orders")
    random_history(uri, seed=7, versions=14)
    latest = storage.latest_version(uri)
    assert latest == 14
    rng = random.Random(3)
    checked = 0
    cases = [(-1, latest, None), (0, latest, None), (3, 9, {0, 1, 2, 3}), (9, 10, None),
             (5, 5, None), (latest - 1, latest, {7})]
    cases += [(s, rng.randint(s, latest), set(rng.sample(range(VNODES), rng.randint(1, VNODES))))
              for s in rng.sample(range(0, latest), 4)]
    for start, end, vnodes in cases:
        checked += assert_matches_brute_force(spark, uri, start, end, vnodes)
    assert checked > 50


@pytest.mark.spark
def test_net_changes_tie_breaks(spark):
    from backfill_assets.engine.netting import net_changes

    rows = [  # (id, v, type, version)
        (1, "a", "insert", 1), (1, "a", "delete", 2), (1, "b", "insert", 2),  # delete+insert in v2
        (2, "a", "update_preimage", 3), (2, "b", "update_postimage", 3),  # plain update
        (3, "a", "update_preimage", 3),  # pk changed away from 3
        (30, "a", "update_postimage", 3),  # ... to 30
        (4, "a", "insert", 1), (4, "a", "delete", 4),  # gone at the end
        (5, "b", "update_postimage", 5), (5, "a", "update_preimage", 5), (5, "c", "delete", 4),
    ]
    df = spark.createDataFrame(rows, "id long, v string, _change_type string, _commit_version long")
    out = {r["id"]: (r["v"], r[OP], r["_commit_version"])
           for r in net_changes(df, ["id"]).toArrow().to_pylist()}
    assert out == {1: ("b", "upsert", 2), 2: ("b", "upsert", 3), 3: ("a", "delete", 3),
                   30: ("a", "upsert", 3), 4: ("a", "delete", 4), 5: ("b", "upsert", 5)}
    assert set(net_changes(df, ["id"]).columns) == {"id", "v", "_commit_version", OP}


@pytest.mark.spark
def test_read_changes_on_a_table_without_vnode_column(spark, warehouse):
    """Any Delta table with CDF: the vnode is computed in Spark by the same hash."""
    from backfill_assets.engine.netting import read_changes

    uri = os.path.join(warehouse, "plain")
    storage.create_table(uri, pa.schema([("id", pa.int64()), ("v", pa.string())]), cdf=True)
    write_deltalake(uri, pa.table({"id": pa.array(range(20), pa.int64()),
                                   "v": [str(i) for i in range(20)]}), mode="append")
    DeltaTable(uri).update(updates={"v": "'x'"}, predicate="id < 5")
    DeltaTable(uri).update(updates={"id": "id + 100"}, predicate="id >= 15")  # pk changes
    DeltaTable(uri).delete("id = 7")
    net = read_changes(spark, uri, 1, 4, None, ["id"], 4).toArrow().to_pylist()
    got = {r["id"]: (r[OP], r["v"], r["vnode"]) for r in net}
    expected = {i: ("upsert", "x", vnode_of((i,), ["bigint"], 4)) for i in range(5)}
    expected |= {i: ("delete", str(i), vnode_of((i,), ["bigint"], 4))
                 for i in (7, 15, 16, 17, 18, 19)}
    expected |= {i + 100: ("upsert", str(i), vnode_of((i + 100,), ["bigint"], 4))
                 for i in range(15, 20)}
    assert got == expected
    some = read_changes(spark, uri, 1, 4, [0, 1], ["id"], 4).toArrow().to_pylist()
    assert {r["id"] for r in some} == {k for k, v in expected.items() if v[2] in (0, 1)}


@pytest.mark.spark
def test_empty_range_has_the_schema(spark, warehouse):
    from backfill_assets.engine.netting import read_changes

    uri = os.path.join(warehouse, "orders")
    create_upstream(uri, SPEC)
    raw = change_range.read_raw_changes(uri, 0, 0)
    assert raw.num_rows == 0 and raw.column_names[-3:] == ["_change_type", "_commit_version",
                                                          "_commit_timestamp"]
    df = read_changes(spark, uri, 0, 0, None, ["region", "id"], VNODES)
    assert df.count() == 0
    assert {"region", "id", "vnode", OP, "_commit_version"} <= set(df.columns)


def test_raw_changes_types_and_range_errors(warehouse):
    uri = os.path.join(warehouse, "orders")
    random_history(uri, seed=1, versions=3)
    raw = change_range.read_raw_changes(uri, 0, 3)
    assert raw.schema.field("region").type == pa.string()  # not string_view
    assert set(raw.column("_commit_version").to_pylist()) <= {1, 2, 3}
    some = change_range.read_raw_changes(uri, 0, 3, columns=["id"])
    assert some.column_names == ["id", "_change_type", "_commit_version"]
    with pytest.raises(HistoryUnavailable, match="out of range"):
        change_range.read_raw_changes(uri, 2, 4)
    with pytest.raises(HistoryUnavailable, match="out of range"):
        change_range.read_raw_changes(uri, 3, 9)
    with pytest.raises(InvalidVersionRange):
        change_range.read_raw_changes(uri, 3, 2)
    with pytest.raises(InvalidVersionRange):
        change_range.read_raw_changes(uri, -2, 2)


def _plain_table(uri: str, cdf: bool) -> None:
    storage.create_table(uri, pa.schema([("id", pa.int64()), ("v", pa.string())]), cdf=cdf)
    write_deltalake(uri, pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}),
                    mode="append")
    DeltaTable(uri).update(updates={"v": "'z'"}, predicate="id = 1")
    DeltaTable(uri).delete("id = 2")


def test_cdf_off_is_named(warehouse):
    """delta-rs would answer with made-up deletes+inserts of whole files: we refuse."""
    uri = os.path.join(warehouse, "nocdf")
    _plain_table(uri, cdf=False)
    with pytest.raises(ChangeFeedDisabled, match="change data feed off"):
        change_range.read_raw_changes(uri, 0, 3)


def test_cdf_switched_on_later_is_named(warehouse):
    uri = os.path.join(warehouse, "latecdf")
    _plain_table(uri, cdf=False)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DeltaTable(uri).delete("id = 3")
    latest = storage.latest_version(uri)
    last = change_range.read_raw_changes(uri, latest - 1, latest).to_pylist()
    assert [r["_change_type"] for r in last] == ["delete"]
    with pytest.raises(ChangeFeedDisabled, match="off at version 1"):
        change_range.read_raw_changes(uri, 0, latest)


def test_vacuumed_history_is_named(warehouse):
    uri = os.path.join(warehouse, "vac")
    _plain_table(uri, cdf=True)  # v1 append, v2 update (rewrites v1's file), v3 delete
    removed = DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False,
                                     dry_run=False)
    assert removed
    with pytest.raises(HistoryUnavailable, match="vacuumed"):
        change_range.read_raw_changes(uri, 0, 3)
    # a later range whose _change_data survived still reads
    assert len(change_range.read_raw_changes(uri, 1, 3).to_pylist()) == 3
    for f in glob.glob(os.path.join(uri, "_change_data", "**", "*.parquet"), recursive=True):
        os.remove(f)
    with pytest.raises(HistoryUnavailable, match="no longer available"):
        change_range.read_raw_changes(uri, 1, 3)


def test_cleaned_log_is_named(warehouse):
    uri = os.path.join(warehouse, "logs")
    _plain_table(uri, cdf=True)
    DeltaTable(uri).create_checkpoint()
    for v in (0, 1):
        os.remove(os.path.join(uri, "_delta_log", f"{v:020d}.json"))
    assert storage.latest_version(uri) == 3
    with pytest.raises(HistoryUnavailable):
        change_range.read_raw_changes(uri, 0, 3)


def _sorted_rows(table: pa.Table) -> list:
    return sorted(table.to_pylist(), key=lambda r: (r["_commit_version"], r["region"], r["id"],
                                                    r["_change_type"]))


def test_a_vnode_read_opens_only_its_vnodes_files(warehouse):
    """An upstream partitioned by vnode: a read for some vnodes equals the full read filtered
    to them, and still works once every other vnode's change and data files are gone (it never
    opened them). `change_rows_by_vnode` estimates each vnode's change rows from the log alone:
    the commits' operation metrics give the total exactly."""
    from backfill_assets import storage

    uri = os.path.join(warehouse, "orders")
    random_history(uri, seed=11, versions=8)
    full = change_range.read_raw_changes(uri, 0, 8)
    sizes = storage.change_rows_by_vnode(uri, 0, 8)
    assert set(sizes) <= set(range(VNODES))
    assert abs(sum(sizes.values()) - full.num_rows) <= 8 * len(sizes)  # rounded per file
    rng = random.Random(5)
    for _ in range(4):
        wanted = set(rng.sample(range(VNODES), rng.randint(1, VNODES - 1)))
        got = change_range.read_raw_changes(uri, 0, 8, vnodes=wanted)
        mine = pa.array(sorted(wanted), full["vnode"].type)
        expected = full.filter(pc.is_in(full["vnode"], mine))
        assert got.num_rows and _sorted_rows(got) == _sorted_rows(expected)
    keep = {0, 3}
    for path in glob.glob(f"{uri}/**/vnode=*/*.parquet", recursive=True):
        if int(path.split("vnode=")[1].split("/")[0]) not in keep:
            os.remove(path)
    with pytest.raises(HistoryUnavailable):
        change_range.read_raw_changes(uri, 0, 8)
    alone = change_range.read_raw_changes(uri, 0, 8, vnodes=keep)
    assert alone.num_rows == sum(1 for v in full.column("vnode").to_pylist() if v in keep) > 0


def test_a_window_reuses_the_range_the_step_read_and_only_it(warehouse):
    """A no_shuffle barrier reads its change range for the changes it forwards, then for its
    window (``reuse``): the second read takes the rows the first read, not the files. Other
    reads always go to the files: a range whose files are gone fails there."""
    from backfill_assets.storage import TableVersion
    from backfill_assets.storage.rows.change_feed import read_change_range

    uri = os.path.join(warehouse, "reuse")
    _plain_table(uri, cdf=True)
    forwarded = change_range.read_raw_changes(uri, 1, 3)  # the step's read
    for f in glob.glob(os.path.join(uri, "_change_data", "**", "*.parquet"), recursive=True):
        os.remove(f)
    snap = TableVersion.load(uri)
    window = read_change_range(snap, 1, 3, ["id", "v"], reuse=True)
    names = ["id", "v", "_change_type", "_commit_version"]
    rows = lambda t: sorted(tuple(r.values()) for r in t.select(names).to_pylist())  # noqa: E731
    assert window.num_rows == 3 and rows(window) == rows(forwarded)
    for read in (lambda: change_range.read_raw_changes(uri, 1, 3),
                 lambda: read_change_range(snap, 1, 3, ["id", "v"])):
        with pytest.raises(HistoryUnavailable):
            read()
