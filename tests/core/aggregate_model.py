"""The aggregate property tests' model: random upstream rows, random DML histories as signed
rows, and a naive GROUP BY from scratch (the oracle) written independently of the algebra:
sums as exact Python ints and Fractions, avg rounded by hand with Fraction arithmetic as Spark
4.2's bytecode does (divide to 39 decimals rounding DOWN, then HALF_UP to the result scale),
min/max by sorting.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from hypothesis import strategies as st

from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import AggregatePlan, SignedRow

GROUP_BY = (GroupColumn("g1", "g1"), GroupColumn("g2", "g2"))
AGGREGATES = parse_aggregates({
    "n": "count(*)", "n_d": "count(d)", "sum_i": "sum(i)", "sum_d": "sum(d)",
    "avg_i": "avg(i)", "avg_d": "avg(d)", "min_d": "min(d)", "max_d": "max(d)",
    "max_s": "max(s)", "min_s": "min(s)", "sum_f": "sum(f)", "avg_f": "avg(f)",
    "min_f": "min(f)", "max_i": "max(i)", "distinct_s": "count(DISTINCT s)",
    "big": "sum(b)", "avg_b": "avg(b)",
})
ARG = {a.name: a.arg for a in AGGREGATES}
TYPES = {"g1": "int", "g2": "string", "i": "int", "d": "decimal(5,2)", "s": "string",
         "f": "double", "b": "bigint"}
PLAN = AggregatePlan.of(GROUP_BY, AGGREGATES,
                        {**{g.name: TYPES[g.expr] for g in GROUP_BY},
                         **{a.name: TYPES[a.arg] for a in AGGREGATES if a.arg}})

_EDGE_D = [Decimal("999.99"), Decimal("-999.99"), Decimal("0.01"), Decimal("-0.01"),
           Decimal("0.00")]
decimals = st.one_of(st.none(), st.sampled_from(_EDGE_D),
                     st.integers(-99999, 99999).map(lambda u: Decimal(u).scaleb(-2)))
floats = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False, width=64),
                   st.sampled_from([0.1, -0.1, 1e-300, 3.0]))
bigints = st.one_of(st.none(), st.sampled_from([2**57, -(2**57), 2**53 + 1, 1]),
                    st.integers(-(2**40), 2**40))
rows = st.fixed_dictionaries({
    "g1": st.one_of(st.none(), st.integers(0, 2)),
    "g2": st.one_of(st.none(), st.sampled_from(["a", "b", "é"])),
    "i": st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.integers(-50, 50)),
    "d": decimals, "s": st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "ÿ", "z"])),
    "f": floats, "b": bigints,
})


def kept(row: dict) -> bool:
    """The MV's filter: a row enters the aggregate only if it passes (``i % 7 <> 0``)."""
    return row["i"] is None or row["i"] % 7 != 0


@st.composite
def histories(draw, max_batches: int = 6) -> list[list[tuple]]:
    """Batches of DML (("insert", pk, row), ("update", pk, row), ("delete", pk, None));
    deletes and updates often aim at the row holding a group's min or max of d."""
    table: dict[int, dict] = {}
    batches, next_pk = [], 0
    for _ in range(draw(st.integers(1, max_batches))):
        batch = []
        for _ in range(draw(st.integers(0, 12))):
            live = sorted(table)
            op = draw(st.sampled_from(["insert", "update", "delete", "extreme"])) if live \
                else "insert"
            if op == "insert":
                table[next_pk] = draw(rows)
                batch.append(("insert", next_pk, table[next_pk]))
                next_pk += 1
                continue
            pk = _extreme(table) if op == "extreme" else draw(st.sampled_from(live))
            if op != "delete" and draw(st.booleans()):
                table[pk] = draw(rows)
                batch.append(("update", pk, table[pk]))
            else:
                del table[pk]
                batch.append(("delete", pk, None))
        batches.append(batch)
    return batches


def _extreme(table: dict[int, dict]) -> int:
    with_d = [pk for pk, r in table.items() if r["d"] is not None]
    if not with_d:
        return min(table)
    return max(with_d, key=lambda pk: (table[pk]["d"], pk))


def signed(row: dict, pk: int, sign: int) -> SignedRow:
    """A row as it enters the aggregate (group key, pk, one argument value per aggregate)."""
    return SignedRow(sign, (row["g1"], row["g2"]), (pk,),
                     tuple(None if a.arg is None else row[a.arg] for a in AGGREGATES))


def to_signed(batch: list[tuple], before: dict[int, dict]) -> list[SignedRow]:
    """The batch as signed rows (pre-images -1, post-images +1), after the filter; ``before``
    is updated to the table after the batch."""
    out = []
    for op, pk, row in batch:
        old = before.get(pk)
        if old is not None and kept(old):
            out.append(signed(old, pk, -1))
        if op == "delete":
            del before[pk]
        else:
            before[pk] = row
            if kept(row):
                out.append(signed(row, pk, +1))
    return out


def recompute(table: dict[int, dict]) -> dict[tuple, dict]:
    """SELECT g1, g2, aggregates FROM table WHERE kept GROUP BY g1, g2, naively."""
    groups: dict[tuple, list[dict]] = {}
    for pk in sorted(table):
        if kept(table[pk]):
            groups.setdefault((table[pk]["g1"], table[pk]["g2"]), []).append(table[pk])
    return {g: {a.name: _naive(a, [r[a.arg] for r in rs] if a.arg else rs, len(rs))
                for a in AGGREGATES} for g, rs in groups.items()}


def _naive(a, values: list, n: int) -> object:
    if a.arg is None:
        return n
    vals = [v for v in values if v is not None]
    if a.function == "count":
        return len(set(vals)) if a.distinct else len(vals)
    if not vals:
        return None
    kind = TYPES[a.arg]
    if a.function in ("min", "max"):
        ordered = sorted(vals, key=lambda v: (math.isnan(v), v) if kind == "double" else v)
        return ordered[0] if a.function == "min" else ordered[-1]
    total = sum(Fraction(v) for v in vals)
    if a.function == "sum":
        if kind in ("int", "bigint"):
            assert -(2**63) <= total < 2**63
            return int(total)
        if kind == "double":
            return float(total)
        return Decimal(total.numerator * 100 // total.denominator).scaleb(-2)
    if kind in ("int", "bigint", "double"):
        return float(total) / len(vals) if kind == "double" else float(int(total)) / float(
            len(vals))
    return _spark_avg(total / len(vals), 6)


def _spark_avg(q: Fraction, scale: int) -> Decimal:
    """Round ``q`` as Spark 4.2 does: to 39 decimals DOWN, then HALF_UP to ``scale``."""
    truncated = Fraction(math.trunc(q * 10**39), 10**39)
    return Decimal(f"{half_up(truncated * 10**scale)}E-{scale}")


def half_up(x: Fraction) -> int:
    n = math.floor(abs(x) + Fraction(1, 2))
    return n if x >= 0 else -n


def float_tolerance(table: dict[int, dict], group: tuple, column: str) -> float:
    """How far a float sum may be from the exact one: (n-1)·2^-53·Σ|v| (Spark's own error)."""
    vals = [r[column] for r in table.values() if kept(r) and (r["g1"], r["g2"]) == group
            and r[column] is not None]
    return max(len(vals), 1) * 2.0**-52 * sum(abs(v) for v in vals)
