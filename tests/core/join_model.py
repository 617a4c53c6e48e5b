"""The join property tests' model: a fact table (orders) and two dimensions (customers keyed
by one column, products keyed by two), random DML on all three per barrier, the barrier's
signed changes netted per key, and the oracle: the join recomputed from the whole tables, as
SQL defines it (a null join column matches nothing), written without the algebra's state.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

from backfill_assets.core.join_algebra import JoinPlan, Signed, key_of
from backfill_assets.core.join_definition import parse_joins

PK = ("id",)
FACT_COLUMNS = ("id", "cust", "pcode", "pver", "amount")
FACT_TYPES = {"id": "bigint", "cust": "int", "pcode": "string", "pver": "int", "amount": "int"}
CUSTOMER_TYPES = {"cid": "int", "region": "string", "tier": "int", "note": "string"}
PRODUCT_TYPES = {"code": "string", "ver": "int", "price": "decimal(7,2)"}
KEYS = (("cid",), ("code", "ver"))


def joins(kinds: tuple[str, str]):
    """The two joins of the model, of the given kinds."""
    return parse_joins([
        {"table": "customers", "key": ["cid"], "on": {"cust": "cid"},
         "columns": ["region", {"name": "cust_tier", "column": "tier"}], "kind": kinds[0]},
        {"table": "products", "key": ["code", "ver"], "on": {"pver": "ver", "pcode": "code"},
         "columns": ["price"], "kind": kinds[1]},
    ])


def plan(kinds: tuple[str, str]) -> JoinPlan:
    return JoinPlan.of(joins(kinds), PK, FACT_COLUMNS,
                       [[CUSTOMER_TYPES["cid"]], [PRODUCT_TYPES["code"], PRODUCT_TYPES["ver"]]])


CUST_KEYS = st.integers(0, 4)
facts = st.fixed_dictionaries({
    "cust": st.one_of(st.none(), CUST_KEYS),
    "pcode": st.one_of(st.none(), st.sampled_from(["a", "b"])),
    "pver": st.one_of(st.none(), st.integers(0, 1)),
    "amount": st.one_of(st.none(), st.integers(-100, 100)),
})
customers = st.fixed_dictionaries({
    "region": st.one_of(st.none(), st.sampled_from(["north", "south", "é"])),
    "tier": st.one_of(st.none(), st.integers(0, 2)),
    "note": st.sampled_from(["x", "y"]),  # not carried: a change to it reaches no MV row
})
products = st.fixed_dictionaries({
    "price": st.one_of(st.none(), st.integers(-99999, 99999).map(
        lambda u: Decimal(u).scaleb(-2)), st.sampled_from([Decimal("0.00"), Decimal("1.50")])),
})
PRODUCT_KEYS = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 1))


class Tables:
    """The three upstream tables as dicts by key, at the current versions."""

    def __init__(self) -> None:
        self.facts: dict[tuple, dict] = {}
        self.customers: dict[tuple, dict] = {}
        self.products: dict[tuple, dict] = {}
        self.next_id = 0

    def copy(self) -> tuple[dict, dict, dict]:
        return dict(self.facts), dict(self.customers), dict(self.products)


@st.composite
def fact_op(draw, t: Tables) -> None:
    """Insert, update (often moving the join key), delete, or change the pk of a fact row."""
    live = sorted(t.facts)
    op = draw(st.sampled_from(["insert", "update", "delete", "repk"])) if live else "insert"
    if op == "insert":
        t.facts[(t.next_id,)] = {"id": t.next_id, **draw(facts)}
        t.next_id += 1
        return
    pk = draw(st.sampled_from(live))
    if op == "delete":
        del t.facts[pk]
    elif op == "update":
        t.facts[pk] = {**t.facts[pk], **draw(facts)}
    else:  # the row moves to a new pk (Delta: delete + insert)
        row = t.facts.pop(pk)
        t.facts[(t.next_id,)] = {**row, "id": t.next_id}
        t.next_id += 1


@st.composite
def dimension_op(draw, t: Tables) -> None:
    """Insert, update, delete or re-add a customer or a product (late rows included)."""
    if draw(st.booleans()):
        key = (draw(CUST_KEYS),)
        if key in t.customers and draw(st.booleans()):
            del t.customers[key]
        else:
            t.customers[key] = {"cid": key[0], **draw(customers)}
    else:
        key = draw(PRODUCT_KEYS)
        if key in t.products and draw(st.booleans()):
            del t.products[key]
        else:
            t.products[key] = {"code": key[0], "ver": key[1], **draw(products)}


@st.composite
def barrier(draw, t: Tables) -> tuple[list[Signed], list[list[Signed]]]:
    """Random DML on both sides, then the barrier's changes netted per key: -(row at the
    start) and +(row at the end) for every key a statement touched."""
    before = t.copy()
    for _ in range(draw(st.integers(0, 8))):
        draw(fact_op(t) if draw(st.booleans()) else dimension_op(t))
    after = (t.facts, t.customers, t.products)
    netted = []
    for old, new in zip(before, after, strict=True):
        out = []
        for key in sorted(set(old) | set(new), key=repr):
            if old.get(key) == new.get(key) and draw(st.integers(0, 3)):
                continue  # untouched (sometimes: a key whose changes cancel out)
            out += [Signed(-1, old[key])] if key in old else []
            out += [Signed(1, new[key])] if key in new else []
        netted.append(out)
    return netted[0], netted[1:]


def naive_join(p: JoinPlan, t: Tables) -> dict[tuple, dict]:
    """The join recomputed from the tables: fact pk -> joined row."""
    dims = (t.customers, t.products)
    out = {}
    for pk, fact in t.facts.items():
        row = {c: fact[c] for c in p.fact_columns}
        for side, table in zip(p.sides, dims, strict=True):
            key = key_of(fact, side.on)
            match = [d for k, d in table.items() if key is not None and k == key]
            if not match and side.kind == "inner":
                row = None
                break
            row |= {n: match[0][c] if match else None for n, c in side.columns}
        if row is not None:
            out[pk] = row
    return out
