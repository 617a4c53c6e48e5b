"""The task bulk's Arrow half (join/bulk_join.py) against the barrier's algebra: over the
model's two joins (one keyed by one column, one by two; tests/core/join_model.py), every
fact as +1 over empty state through `JoinTables.apply` gives the index rows and joined rows
the lookup by position must give, vnode for vnode, for each inner / left combination, with
null join keys and facts no dimension row matches (pure Arrow, no Spark)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.arrow.join_state import JoinTables
from backfill_assets.core.names import VNODE
from backfill_assets.join.bulk_join import Lookup, index_rows, joined_rows
from tests.core.join_model import CUSTOMER_TYPES, FACT_TYPES, PRODUCT_TYPES, plan

KINDS = [("left", "left"), ("left", "inner"), ("inner", "left"), ("inner", "inner")]


def _rows(rng: random.Random) -> tuple[list[dict], list[dict], list[dict]]:
    facts = [{"id": i, "cust": rng.choice([None, *range(8)]),
              "pcode": rng.choice([None, "a", "b", "c"]), "pver": rng.choice([None, 0, 1, 2]),
              "amount": rng.randint(-5, 50)} for i in range(400)]
    customers = [{"cid": c, "region": rng.choice(["n", "s", None]), "tier": rng.randint(0, 3),
                  "note": "x"} for c in range(6)]
    products = [{"code": c, "ver": v, "price": None} for c in "ab" for v in (0, 1)]
    return facts, customers, products


def _signed(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{SIGN: 1, **r} for r in rows], schema=schema)


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=repr)


@pytest.mark.parametrize("kinds", KINDS)
def test_the_lookup_gives_the_algebras_index_and_joined_rows(kinds):
    jt = JoinTables(plan(kinds), FACT_TYPES, [CUSTOMER_TYPES, PRODUCT_TYPES], 8)
    facts, customers, products = _rows(random.Random(hash(kinds) % 1000))
    want = jt.apply([s.empty_table() for s in jt.index_schemas],
                    [s.empty_table() for s in jt.dimension_schemas],
                    _signed(facts, jt.fact_change_schema),
                    [_signed(d, s) for d, s in zip((customers, products),
                                                   jt.dimension_change_schemas, strict=True)])
    fact_rows = jt.with_vnode(pa.Table.from_pylist(facts, schema=jt.fact_row_schema),
                              list(jt.plan.pk))
    lookups = [Lookup(s.on, s.key, jt.with_vnode(pa.Table.from_pylist(
        d, schema=pa.schema([f for f in schema if f.name != VNODE])), list(s.key)))
        for s, d, schema in zip(jt.plan.sides, (customers, products), jt.dimension_schemas,
                                strict=True)]
    positions = [lk.positions(fact_rows) for lk in lookups]
    for i, schema in enumerate(jt.index_schemas):
        got = index_rows(jt, i, fact_rows, lookups[i], positions[i], schema.names)
        assert _sorted(got.cast(schema)) == _sorted(want.index_after[i].cast(schema)), i
    joined = joined_rows(jt, fact_rows, lookups, positions)
    names = jt.joined_schema.names[1:]
    assert _sorted(joined.select(names)) == _sorted(want.joined.select(names)), kinds


@pytest.mark.parametrize("columns", [1, 2])
def test_positions_are_the_hash_joins_match(columns):
    rng = random.Random(columns)
    keys = sorted({tuple(rng.randint(0, 9) for _ in range(columns)) for _ in range(40)})
    rng.shuffle(keys)
    dim = pa.table({f"k{j}": [k[j] for k in keys] for j in range(columns)})
    facts = pa.table({f"f{j}": [None if rng.random() < 0.1 else rng.randint(0, 11)
                                for _ in range(300)] for j in range(columns)})
    on = tuple(f"f{j}" for j in range(columns))
    lookup = Lookup(on, tuple(f"k{j}" for j in range(columns)), dim)
    got = lookup.positions(facts).to_pylist()
    where = {k: i for i, k in enumerate(keys)}
    want = [None if None in row else where.get(row)
            for row in zip(*(facts.column(c).to_pylist() for c in on), strict=True)]
    assert got == want
    assert any(p is None for p in got) and any(p is not None for p in got)


def test_the_sort_order_is_arrows_for_every_key_type():
    """numpy's lexsort where the columns allow it (integers, dates), Arrow's sort otherwise:
    the same order of rows unique by their key."""
    import datetime as dt

    import pyarrow.compute as pc

    from backfill_assets.join.bulk_tasks import sort_order

    rng = random.Random(3)
    ids = list(range(3000))
    rng.shuffle(ids)
    rows = pa.table({VNODE: pa.array([rng.randint(0, 7) for _ in ids], pa.int32()),
                     "k": [rng.randint(-5, 50) for _ in ids],
                     "d": [dt.date(2020, 1, 1) + dt.timedelta(days=rng.randint(0, 30))
                           for _ in ids],
                     "s": [str(rng.randint(0, 9)) for _ in ids], "id": ids})
    for names in ([VNODE, "k", "id"], [VNODE, "d", "id"], [VNODE, "s", "id"]):
        want = pc.sort_indices(rows, [(n, "ascending") for n in names]).to_pylist()
        assert sort_order(rows, names).to_pylist() == want, names
