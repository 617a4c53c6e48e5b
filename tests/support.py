"""Scenario driver for end-to-end tests: a live upstream, barriers, and the oracle after each.

Random DML between barriers hits keys below, at and above the vnodes' positions (inserts,
updates, deletes, pk-changing updates); every barrier is followed by the independent oracle.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from backfill_assets import storage
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.upstream.writer import DmlBatch, UpstreamSpec, apply_dml, create_upstream
from backfill_assets.verify.oracle import verify

SIMPLE_COLUMNS = {"id": "bigint", "name": "string", "amount": "decimal(12,2)",
                  "qty": "int", "day": "date"}


def simple_spec(vnode_count: int, name: str = "orders") -> UpstreamSpec:
    return UpstreamSpec(name=name, columns=SIMPLE_COLUMNS, primary_key=("id",),
                        vnode_count=vnode_count)


def simple_row(rng: random.Random, key: int) -> dict:
    return {"id": key, "name": rng.choice(["ann", "bob", "cy", "dee", "ed"]),
            "amount": Decimal(rng.randint(0, 99999)) / 100, "qty": rng.randint(0, 20),
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 400))}


def simple_mv(vnode_count: int, mode: str = "arrangement", chunk_size: int = 10,
              upstream: str = "orders", **extra) -> MVDefinition:
    raw = {"name": f"mv_{mode}", "upstream": upstream, "primary_key": ["id"],
           "columns": ["id", "name", "amount", "qty"], "filter": "qty > 2",
           "computed": [{"name": "amount_x_qty", "expr": "amount * qty"},
                        {"name": "name_upper", "expr": "upper(name)"}],
           "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count, **extra}
    return MVDefinition.from_dict(raw)


@dataclass
class LiveUpstream:
    """An upstream table plus a model of its keys, for generating valid random DML."""

    uri: str
    spec: UpstreamSpec
    rng: random.Random
    make_row: Callable[[random.Random, object], dict]
    next_key: Callable[[random.Random], object]
    keys: set = field(default_factory=set)
    storage_options: dict | None = None  # deltalake-style options of an object-store URI

    def create(self, rows: int) -> None:
        create_upstream(self.uri, self.spec, self.storage_options)
        batch = [self.make_row(self.rng, self.fresh_key()) for _ in range(rows)]
        self.apply(DmlBatch(inserts=batch))

    def fresh_key(self):
        while True:
            key = self.next_key(self.rng)
            if key not in self.keys:
                self.keys.add(key)
                return key

    def apply(self, batch: DmlBatch) -> int:
        return apply_dml(self.uri, batch, spec=self.spec, storage_options=self.storage_options)

    def random_batch(self, size: int) -> DmlBatch:
        """A mix of inserts, updates, deletes and pk changes over random existing keys."""
        live = sorted(self.keys, key=repr)
        self.rng.shuffle(live)
        picked, inserts, updates, deletes, pk_changes = set(), [], [], [], []
        for _ in range(size):
            kind = self.rng.choice(["insert", "update", "update", "delete", "pk_change"])
            if kind == "insert" or not live:
                inserts.append(self.make_row(self.rng, self.fresh_key()))
                continue
            key = live.pop()
            if key in picked:
                continue
            picked.add(key)
            if kind == "update":
                updates.append(self.make_row(self.rng, key))
            elif kind == "delete":
                deletes.append(_as_key(key))
                self.keys.discard(key)
            else:
                new = self.fresh_key()
                picked.add(new)
                pk_changes.append((_as_key(key), self.make_row(self.rng, new)))
                self.keys.discard(key)
        return DmlBatch(inserts=inserts, updates=updates, deletes=deletes, pk_changes=pk_changes)

    def delete_where(self, predicate: Callable[[object], bool]) -> int:
        doomed = [k for k in self.keys if predicate(k)]
        self.keys.difference_update(doomed)
        return self.apply(DmlBatch(deletes=[_as_key(k) for k in doomed]))


def _as_key(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def drive(spark, d: MVDefinition, tables: MVTables, live: LiveUpstream, *,
          ranges: Sequence[Sequence[int]] | Callable[[int], Sequence[Sequence[int]]],
          changes_per_barrier: int = 8, extra_barriers: int = 3, max_barriers: int = 200,
          check_every: int = 1, between: Callable[[int], None] | None = None) -> dict:
    """Barriers until every vnode is finished (+`extra_barriers` of pure change-feed
    maintenance), DML before each barrier, the oracle after every `check_every` barriers."""
    finished_at = None
    stats = {"barriers": 0, "snapshot_rows": 0, "forwarded_rows": 0, "verified_rows": 0}
    for n in range(max_barriers):
        live.apply(live.random_batch(changes_per_barrier))
        if between:
            between(n)
        plan = ranges(n) if callable(ranges) else ranges
        reports = [run_barrier(spark, d, tables, list(r)) for r in plan]
        stats["barriers"] += 1
        stats["snapshot_rows"] += sum(r.snapshot_rows for r in reports)
        stats["forwarded_rows"] += sum(r.forwarded_rows for r in reports)
        if n % check_every == 0:
            assert_verified(spark, d, tables, stats)
        done = all(r.finished for r in reports)
        if done and finished_at is None:
            finished_at = n
        if finished_at is not None and n - finished_at >= extra_barriers:
            break
    else:
        raise AssertionError(f"backfill did not finish within {max_barriers} barriers")
    assert_verified(spark, d, tables, stats)
    return stats


def assert_verified(spark, d: MVDefinition, tables: MVTables, stats: dict | None = None) -> None:
    """The oracle is green, every reader of the MV sees the rows the oracle compared, and the
    MV's change feed since the last check replays the previous rows into the current ones."""
    verdict = verify(spark, d, tables)
    bad = verdict.failures()
    assert not bad, f"oracle mismatch in vnodes {[(v.vnode, v.missing, v.unexpected) for v in bad]}"
    assert not verdict.type_problems, f"MV column types differ: {verdict.type_problems}"
    if stats is not None:
        stats["verified_rows"] += verdict.rows_compared
    assert_mv_readers_and_feed(spark, tables.mv, [k.name for k in d.primary_key])


_SEEN: dict[str, tuple[int, dict]] = {}  # MV uri -> (version, rows by key) at the last check


def assert_mv_readers_and_feed(spark, uri: str, key_names: Sequence[str]) -> None:
    """delta-rs scan (what the oracle read) == QueryBuilder == polars == the storage layer's
    Spark reader; and load_cdf (last checked version, now] applied to the rows seen then
    gives the rows now (exact pre/post images, nothing lost or invented)."""
    table = DeltaTable(uri)
    scan = pa.table(table.scan())
    expected = _multiset(scan)
    query = pa.table(QueryBuilder().register("mv", table).execute("select * from mv").read_all())
    assert _multiset(query) == expected, "QueryBuilder disagrees with scan"
    assert _multiset(pl.read_delta(uri).to_arrow()) == expected, "polars disagrees with scan"
    spark_rows = storage.read_table_version(spark, storage.TableVersion.load(uri)).toArrow()
    assert _multiset(spark_rows) == expected, "the storage layer's Spark reader disagrees"
    now = {_key(r, key_names): _canon(r) for r in scan.to_pylist()}
    version, before = _SEEN.get(uri, (None, {}))
    if version is not None and version < table.version():
        feed = pa.table(table.load_cdf(starting_version=version + 1,
                                       ending_version=table.version()))
        replay = dict(before)
        for v in sorted(set(feed["_commit_version"].to_pylist())):
            rows = [r for r in feed.to_pylist() if r["_commit_version"] == v]
            for r in rows:
                if r["_change_type"] in ("delete", "update_preimage"):
                    gone = replay.pop(_key(r, key_names), None)
                    assert gone == _canon(r), f"feed v{v} removes a row the MV did not hold: {r}"
            for r in rows:
                if r["_change_type"] in ("insert", "update_postimage"):
                    assert _key(r, key_names) not in replay, f"feed v{v} inserts a held key: {r}"
                    replay[_key(r, key_names)] = _canon(r)
        assert replay == now, "the MV's change feed does not replay into the MV"
    _SEEN[uri] = (table.version(), now)


def _multiset(table: pa.Table) -> Counter:
    return Counter(json.dumps(_canon(r), sort_keys=True) for r in table.to_pylist())


def _canon(row: dict) -> dict:
    return {k: str(v) for k, v in row.items()
            if k not in ("_change_type", "_commit_version", "_commit_timestamp")}


def _key(row: dict, key_names: Sequence[str]) -> tuple:
    return tuple(str(row[k]) for k in key_names)


# ------------------------------------------------------------------ followers (running loops)


def progress_rows(tables: MVTables) -> dict[int, dict]:
    """The progress table's rows by vnode ({} before the first barrier)."""
    from backfill_assets.mv.owned_tables import open_if_exists, read_rows

    table = open_if_exists(tables.progress, tables.storage_options)
    if table is None:
        return {}
    rows = read_rows(table, None, ["vnode", "row_count", "backfill_finished", "version"])
    return {r["vnode"]: r for r in rows.to_pylist()}


def caught_up(tables: MVTables, version: int, vnode_count: int) -> bool:
    """Every vnode's progress has reached upstream `version` (a follower took it)."""
    rows = progress_rows(tables)
    return len(rows) == vnode_count and all(r["version"] >= version for r in rows.values())


def wait_for(what: str, predicate: Callable[[], bool], seconds: float = 120) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# storage.BulkRows' test transform (tests/storage/test_bulk_write.py): defined here because
# Spark's Python workers must import it by module name
BULK_TARGET = pa.schema([("id", pa.int64()), ("name", pa.string()), ("twice", pa.int64()),
                         ("vnode", pa.int32())])


class Refused(Exception):
    """What the test transform raises for a name it will not handle."""


class Twice:
    """Rows with qty > 0, plus 2 * qty; refuses the name 'refuse'."""

    keeps_every_row = False

    def __call__(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        if pc.any(pc.equal(table.column("name"), "refuse")).as_py():
            raise Refused("the name 'refuse' is not handled here")
        kept = table.filter(pc.fill_null(pc.greater(table.column("qty"), 0), False))
        twice = pc.multiply(pc.cast(kept.column("qty"), pa.int64()), 2)
        return pa.table({"id": kept.column("id"), "name": kept.column("name"), "twice": twice,
                         "vnode": kept.column("vnode")}, schema=BULK_TARGET)
