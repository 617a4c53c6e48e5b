"""The join state's MV against Spark's own JOIN over the same tables: after a random DML
history on the fact and both dimensions (join keys moving, null join keys, dimension rows
deleted and re-added, late dimension rows), the rows the Arrow algebra built equal Spark SQL's
`[LEFT] JOIN ... ON` of the final tables (the SQL `join_sql` writes for the oracle), for
every inner / left combination; and the aggregate
over them equals Spark's GROUP BY over that join. Spark is the oracle here, independent of the
Python recompute the property tests use."""

from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pytest

from backfill_assets.arrow.types import arrow_type
from backfill_assets.core.join_algebra import Signed
from backfill_assets.core.join_definition import join_sql
from tests.core.join_model import (
    CUSTOMER_TYPES,
    FACT_COLUMNS,
    FACT_TYPES,
    PRODUCT_TYPES,
    Tables,
    joins,
)
from tests.core.test_join_algebra import apply_to_mv
from tests.test_arrow_joins import Store, tables_for

pytestmark = pytest.mark.spark


def _maybe(rnd: random.Random, value: object) -> object:
    return None if rnd.random() < 0.2 else value


def _dml(rnd: random.Random, t: Tables) -> None:
    """One random statement on one of the three tables."""
    pick = rnd.random()
    if pick < 0.5:
        live = sorted(t.facts)
        if live and rnd.random() < 0.4:
            pk = rnd.choice(live)
            if rnd.random() < 0.3:
                del t.facts[pk]
            else:
                t.facts[pk] = {**t.facts[pk], "cust": _maybe(rnd, rnd.randint(0, 6))}
            return
        t.facts[(t.next_id,)] = {"id": t.next_id, "cust": _maybe(rnd, rnd.randint(0, 6)),
                                 "pcode": _maybe(rnd, rnd.choice("ab")),
                                 "pver": _maybe(rnd, rnd.randint(0, 1)),
                                 "amount": _maybe(rnd, rnd.randint(-50, 50))}
        t.next_id += 1
    elif pick < 0.8:
        key = (rnd.randint(0, 6),)
        if key in t.customers and rnd.random() < 0.4:
            del t.customers[key]
        else:
            t.customers[key] = {"cid": key[0], "region": _maybe(rnd, rnd.choice(["n", "s"])),
                                "tier": _maybe(rnd, rnd.randint(0, 2)), "note": "x"}
    else:
        key = (rnd.choice("abc"), rnd.randint(0, 1))
        if key in t.products and rnd.random() < 0.4:
            del t.products[key]
        else:
            t.products[key] = {"code": key[0], "ver": key[1], "price": _maybe(
                rnd, Decimal(rnd.randint(-9999, 9999)).scaleb(-2))}


def _netted(old: dict, new: dict) -> list[Signed]:
    out = []
    for key in set(old) | set(new):
        if old.get(key) != new.get(key):
            out += [Signed(-1, old[key])] if key in old else []
            out += [Signed(1, new[key])] if key in new else []
    return out


def _frame(spark, rows: dict, types: dict[str, str]):
    schema = pa.schema([pa.field(c, arrow_type(t)) for c, t in types.items()])
    table = pa.Table.from_pylist(list(rows.values()), schema)
    return spark.createDataFrame(table.to_pandas(), schema=", ".join(
        f"{c} {t}" for c, t in types.items()))


def test_the_arrow_join_equals_sparks_join_of_the_final_tables(spark) -> None:
    rnd = random.Random(50)
    runs = {kinds: (Store(tables_for(kinds)), {}) for kinds in
            (("inner", "inner"), ("inner", "left"), ("left", "inner"), ("left", "left"))}
    t = Tables()
    for _ in range(40):
        before = t.copy()
        for _ in range(rnd.randint(1, 12)):
            _dml(rnd, t)
        facts, customers, products = (_netted(o, n) for o, n in zip(
            before, (t.facts, t.customers, t.products), strict=True))
        for store, mv in runs.values():
            apply_to_mv(mv, store.apply(facts, [customers, products]))
    _frame(spark, t.facts, FACT_TYPES).createOrReplaceTempView("orders")
    _frame(spark, t.customers, CUSTOMER_TYPES).createOrReplaceTempView("customers")
    _frame(spark, t.products, PRODUCT_TYPES).createOrReplaceTempView("products")
    for (c_kind, p_kind), (_, mv) in runs.items():
        sql = join_sql(joins((c_kind, p_kind)), "orders",
                       {"customers": "customers", "products": "products"}, FACT_COLUMNS)
        want = {(r["id"],): r.asDict() for r in spark.sql(sql).collect()}
        assert mv == want, (c_kind, p_kind)
        assert len(want) >= 10  # the history left rows of every kind to compare
    grouped = spark.sql(
        "SELECT c.region, count(*) AS n, sum(o.amount) AS total, sum(p.price) AS value "
        "FROM orders o LEFT JOIN customers c ON o.cust = c.cid "
        "LEFT JOIN products p ON o.pcode = p.code AND o.pver = p.ver GROUP BY c.region")
    rows = runs[("left", "left")][1].values()
    mine: dict = {}
    for r in rows:
        n, total, value = mine.get(r["region"], (0, None, None))
        mine[r["region"]] = (n + 1, _add(total, r["amount"]), _add(value, r["price"]))
    assert mine == {r["region"]: (r["n"], r["total"], r["value"]) for r in grouped.collect()}


def _add(total: object, value: object) -> object:
    return total if value is None else value if total is None else total + value
