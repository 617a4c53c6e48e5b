"""The vectorised join algebra (arrow/join_state.py) after every barrier of random DML on the
fact and both dimensions: its signed rows equal the pure reference's (core/join_algebra.py),
the MV they build equals the join recomputed from the tables, and the state is carried
between barriers only as the tables it writes (upserts and deletes by key, vnode checked), as
Delta will carry it."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.arrow.join_state import JoinTables
from backfill_assets.core.errors import DimensionKeyNotUnique, JoinStateMismatch
from backfill_assets.core.join_algebra import JoinPlan, JoinState, Signed
from backfill_assets.core.join_algebra import apply_batch as reference_batch
from backfill_assets.core.join_definition import parse_joins
from backfill_assets.core.names import VNODE
from backfill_assets.core.vnode import vnode_of
from tests.core.join_model import (
    CUSTOMER_TYPES,
    FACT_TYPES,
    PK,
    PRODUCT_TYPES,
    Tables,
    barrier,
    naive_join,
    plan,
)
from tests.core.test_join_algebra import KINDS, apply_to_mv

VNODES = 8


def tables_for(kinds) -> JoinTables:
    return JoinTables(plan(kinds), FACT_TYPES, [CUSTOMER_TYPES, PRODUCT_TYPES], VNODES)


def change_table(changes: list[Signed], schema: pa.Schema) -> pa.Table:
    rows = [{SIGN: c.sign, **{n: c.row.get(n) for n in schema.names[1:]}} for c in changes]
    return pa.Table.from_pylist(rows, schema=schema)


class Store:
    """The state tables as dicts keyed like their Delta tables. ``keyed``: hand `apply` only
    the rows its three keyed read rounds ask for, as a step reading Delta by key will; else
    the whole tables."""

    def __init__(self, t: JoinTables, keyed: bool = False) -> None:
        self.t, self.keyed = t, keyed
        self.index: list[dict[tuple, dict]] = [{} for _ in t.plan.sides]
        self.dims: list[dict[tuple, dict]] = [{} for _ in t.plan.sides]
        self.joined: pa.Table | None = None

    def apply(self, facts: list[Signed], dims: list[list[Signed]]) -> list[tuple[int, dict]]:
        t, sides = self.t, self.t.plan.sides
        fact_changes = change_table(facts, t.fact_change_schema)
        dim_changes = [change_table(c, s) for c, s in zip(dims, t.dimension_change_schemas,
                                                          strict=True)]
        state = self._keyed_reads(fact_changes, dim_changes) if self.keyed else (
            _tables(self.index, t.index_schemas), _tables(self.dims, t.dimension_schemas))
        update = t.apply(*state, fact_changes, dim_changes)
        for i, side in enumerate(sides):
            self._write_index(i, update.index_before[i], update.index_after[i])
            self._write(self.dims[i], side.key, update.dimension_upserts[i],
                        update.dimension_deletes[i], side.key, side.key_types)
        assert update.joined.schema == t.joined_schema
        self.joined = update.joined  # the barrier's signed rows as the Arrow table
        return [(r.pop(SIGN), r) for r in update.joined.to_pylist()]

    def _keyed_reads(self, fact_changes: pa.Table, dim_changes: list[pa.Table]) -> tuple:
        """The state rows of the keys `changed_keys` and `lookup_keys` name."""
        t = self.t
        _, keys = t.changed_keys(fact_changes, dim_changes)
        index = [_rows(store, schema, {k for k in store if k[:len(s.on)] in _keys(wanted)})
                 for store, schema, wanted, s in zip(self.index, t.index_schemas, keys,
                                                     t.plan.sides, strict=True)]
        lookups = t.lookup_keys(t.reached_facts(index, keys), fact_changes, keys)
        dims = [_rows(store, schema, _keys(wanted)) for store, schema, wanted in
                zip(self.dims, t.dimension_schemas, lookups, strict=True)]
        return index, dims

    def _write_index(self, i: int, before: pa.Table, after: pa.Table) -> None:
        """A keyed write as `storage.apply_keyed` does it: each ``before`` row is the row
        held (a fact retracted that the index never held is refused), ``after`` replaces."""
        side = self.t.plan.sides[i]
        key = (*side.on, *(c for c in PK if c not in side.on))
        for row in before.to_pylist():
            if tuple(row[c] for c in key) not in self.index[i]:
                raise JoinStateMismatch("the index never held the retracted fact")
        self._write(self.index[i], key, after, before, side.on, side.key_types)

    def facts(self) -> dict[tuple, dict]:
        """The fact rows the indexes hold (a fact with a null join key in every join is in
        none)."""
        return {tuple(r[c] for c in PK): {c: r[c] for c in self.t.plan.fact_columns}
                for d in self.index for r in d.values()}

    def _write(self, store: dict, key: tuple, upserts: pa.Table, deletes: pa.Table,
               hashed: tuple, types: tuple | None = None) -> None:
        types = types or tuple(FACT_TYPES[c] for c in hashed)
        for table, delete in ((deletes, True), (upserts, False)):
            for row in table.to_pylist():
                assert row[VNODE] == vnode_of(tuple(row[c] for c in hashed), types, VNODES)
                k = tuple(row[c] for c in key)
                if delete:
                    del store[k]  # a delete names a row that is there
                else:
                    store[k] = row


def _keys(table: pa.Table) -> set[tuple]:
    return set(zip(*(table.column(c).to_pylist() for c in table.schema.names), strict=True))


def _rows(store: dict, schema: pa.Schema, keys: set[tuple]) -> pa.Table:
    """The rows of ``store`` under ``keys``, as a keyed Delta read returns them."""
    return pa.Table.from_pylist([store[k] for k in keys if k in store], schema)


def _tables(stores: list[dict], schemas: list[pa.Schema]) -> list[pa.Table]:
    return [pa.Table.from_pylist(list(d.values()), s)
            for d, s in zip(stores, schemas, strict=True)]


def ordered(signed: list[tuple[int, dict]]) -> list:
    return sorted(((s, sorted(r.items(), key=repr)) for s, r in signed), key=repr)


@settings(max_examples=100, deadline=None)
@given(KINDS, st.data())
def test_arrow_rows_equal_the_reference_and_the_join_recomputed(kinds, data) -> None:
    t, tables = tables_for(kinds), Tables()
    keyed = data.draw(st.booleans())  # only the rows of the keyed reads, or whole tables
    store, reference, mv = Store(t, keyed), JoinState.empty(t.plan), {}
    for _ in range(data.draw(st.integers(1, 6))):
        facts, dims = data.draw(barrier(tables))
        got = store.apply(facts, dims)
        assert ordered(got) == ordered(reference_batch(t.plan, reference, facts, dims))
        apply_to_mv(mv, got)
        assert mv == naive_join(t.plan, tables)
        assert store.facts() == {k: r for k, r in tables.facts.items()
                                 if any(all(r[c] is not None for c in s.on)
                                        for s in t.plan.sides)}
        for i in range(len(t.plan.sides)):
            assert set(store.index[i]) == {(*k, *pk) for k, pks in reference.index[i].items()
                                           for pk in pks}
            assert set(store.dims[i]) == set(reference.dimensions[i])
    # snapshot mode's bulk build: every row of the final tables as +1 over an empty state
    bulk, built = Store(t), {}
    apply_to_mv(built, bulk.apply([Signed(1, r) for r in tables.facts.values()],
                                  [[Signed(1, r) for r in tables.customers.values()],
                                   [Signed(1, r) for r in tables.products.values()]]))
    assert built == mv
    assert (bulk.index, bulk.dims) == (store.index, store.dims)


def test_the_state_tables_are_keyed_and_typed_for_delta() -> None:
    t = tables_for(("left", "inner"))
    assert t.fact_row_schema.names == ["id", "cust", "pcode", "pver", "amount"]
    # each index row carries the fact's columns after its key (join key + pk)
    assert [s.names for s in t.index_schemas] == [
        ["cust", "id", "pcode", "pver", "amount", VNODE],
        ["pcode", "pver", "id", "cust", "amount", VNODE]]
    assert [s.names for s in t.dimension_schemas] == [["cid", "region", "tier", VNODE],
                                                      ["code", "ver", "price", VNODE]]
    assert str(t.dimension_schemas[1].field("price").type) == "decimal128(7, 2)"
    assert t.joined_schema.names == [SIGN, "id", "cust", "pcode", "pver", "amount", "region",
                                     "cust_tier", "price"]


def test_refusals_match_the_reference() -> None:
    t = tables_for(("left", "left"))
    store = Store(t)
    customer = {"cid": 1, "region": "north", "tier": 0, "note": "x"}
    with pytest.raises(DimensionKeyNotUnique, match="not unique"):
        store.apply([], [[Signed(1, customer), Signed(1, customer)], []])
    store.apply([], [[Signed(1, customer)], []])
    with pytest.raises(DimensionKeyNotUnique, match="already holds"):
        store.apply([], [[Signed(1, customer)], []])
    with pytest.raises(JoinStateMismatch, match="never held"):
        store.apply([Signed(-1, {"id": 3, "cust": 1})], [[], []])


def test_a_null_join_key_matches_nothing_on_either_side() -> None:
    t = tables_for(("left", "left"))
    store = Store(t)
    fact = {"id": 1, "cust": None, "pcode": "a", "pver": None, "amount": 1}
    null_product = {"code": "a", "ver": None, "price": 1}
    got = store.apply([Signed(1, fact)], [[], [Signed(1, null_product)]])
    assert [(s, r["region"], r["price"]) for s, r in got] == [(1, None, None)]
    assert store.dims[1] == {} and store.index == [{}, {}]  # nothing null is kept or indexed


def test_the_state_tables_round_trip_through_delta(tmp_path) -> None:
    from deltalake import DeltaTable, write_deltalake

    t = tables_for(("inner", "left"))
    store = Store(t)
    store.apply([Signed(1, {"id": 1, "cust": 2, "pcode": "b", "pver": 1, "amount": 3})],
                [[Signed(1, {"cid": 2, "region": "é", "tier": None, "note": "x"})],
                 [Signed(1, {"code": "b", "ver": 1, "price": None})]])
    tables = {              **{f"index_{i}": (list(d.values()), s) for i, (d, s) in
                 enumerate(zip(store.index, t.index_schemas, strict=True))},
              **{f"dimension_{i}": (list(d.values()), s) for i, (d, s) in
                 enumerate(zip(store.dims, t.dimension_schemas, strict=True))}}
    for name, (rows, schema) in tables.items():
        write_deltalake(str(tmp_path / name), pa.Table.from_pylist(rows, schema),
                        partition_by=[VNODE])
        back = DeltaTable(str(tmp_path / name)).to_pyarrow_table()
        assert back.select(schema.names).to_pylist() == rows, name


def test_every_platform_type_goes_through_the_join_and_an_unchanged_nan_cancels() -> None:
    values = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4, "string": "s",
              "binary": b"b", "date": dt.date(2020, 1, 1),
              "timestamp": dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
              "timestamp_ntz": dt.datetime(2020, 1, 1), "float": math.nan, "double": math.nan,
              "boolean": True, "null": None, "decimal(5,2)": Decimal("1.50")}
    fact_types = {"id": "bigint", "k": "string", **{f"c_{t}": t for t in values}}
    dim_types = {"key": "string", **{f"d_{t}": t for t in values}}
    (join,) = parse_joins([{"table": "d", "key": ["key"], "on": {"k": "key"},
                            "columns": [f"d_{t}" for t in values], "kind": "left"}])
    t = JoinTables(JoinPlan.of([join], ["id"], list(fact_types), [["string"]]), fact_types,
                   [dim_types], VNODES)
    store = Store(t)
    fact = {"id": 1, "k": "a", **{f"c_{n}": v for n, v in values.items()}}
    dim = {"key": "a", **{f"d_{n}": v for n, v in values.items()}}
    (row,) = store.apply([Signed(1, fact)], [[Signed(1, dim)]])
    assert row[0] == 1 and math.isnan(row[1]["d_double"]) and row[1]["c_null"] is None
    assert row[1]["d_decimal(5,2)"] == Decimal("1.50") and row[1]["d_binary"] == b"b"
    assert store.apply([Signed(-1, fact), Signed(1, fact)], [[]]) == []  # NaN equals itself
    moved = store.apply([], [[Signed(-1, dim), Signed(1, {**dim, "d_string": "z"})]])
    assert [(s, r["d_string"]) for s, r in moved] == [(-1, "s"), (1, "z")]
