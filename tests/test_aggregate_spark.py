"""The aggregate state's MV against Spark's own GROUP BY over the same rows: result types from
Spark's analysis, values (avg's HALF_UP rounding and its 38-digit divide included), after a
DML history with group moves, deletes of the current extreme, nulls and emptied groups."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pyarrow as pa

from backfill_assets.arrow.aggregate_state import SIGN, AggregateTables, value_column
from backfill_assets.arrow.types import arrow_type
from backfill_assets.core.aggregate_definition import GroupColumn, parse_aggregates
from backfill_assets.core.aggregates import AggregatePlan, exact_value, unscaled

TYPES = {"g1": "int", "g2": "string", "i": "int", "d": "decimal(5,2)", "s": "string",
         "f": "double", "b": "bigint", "e": "decimal(36,2)"}
CALLS = {"n": "count(*)", "n_d": "count(d)", "sum_i": "sum(i)", "sum_d": "sum(d)",
         "avg_i": "avg(i)", "avg_d": "avg(d)", "min_d": "min(d)", "max_d": "max(d)",
         "max_s": "max(s)", "min_s": "min(s)", "sum_f": "sum(f)", "avg_f": "avg(f)",
         "min_f": "min(f)", "max_f": "max(f)", "distinct_s": "count(DISTINCT s)",
         "sum_b": "sum(b)", "avg_b": "avg(b)", "sum_e": "sum(e)", "avg_e": "avg(e)"}
AGGS = parse_aggregates(CALLS)
GROUP_BY = (GroupColumn("g1", "g1"), GroupColumn("g2", "g2"))
PLAN = AggregatePlan.of(GROUP_BY, AGGS, {"g1": "int", "g2": "string",
                                         **{a.name: TYPES[a.arg] for a in AGGS if a.arg}})
TABLES = AggregateTables(PLAN, [("id", "bigint")], vnode_count=8)
FILTER = "i IS NULL OR i % 7 <> 0"
HALF_PKS = 10**7
BIG = Decimal("1" + "0" * 31 + ".01")  # 34 digits: avg(e) rounds at 38 digits, scale 6


def passes(row: dict) -> bool:
    return row["i"] is None or row["i"] % 7 != 0


def random_row(rnd: random.Random) -> dict:
    def maybe(value):
        return None if rnd.random() < 0.15 else value
    return {"g1": maybe(rnd.randint(0, 3)), "g2": maybe(rnd.choice(["a", "b", "é"])),
            "i": maybe(rnd.randint(-60, 60)), "d": maybe(Decimal(rnd.randint(-99999, 99999))
                                                          .scaleb(-2)),
            "s": maybe(rnd.choice(["", "a", "ab", "ÿ"])),
            "f": maybe(rnd.choice([rnd.uniform(-1e6, 1e6), 0.1, math.nan])),
            "b": maybe(rnd.choice([2**57, -(2**56), rnd.randint(-(2**40), 2**40)])),
            "e": maybe(rnd.choice([BIG, Decimal("0.00"), Decimal(rnd.randint(-10**6, 10**6))
                                   .scaleb(-2)]))}


# groups whose avg(d) is exactly half a unit of the result scale: HALF_UP, not HALF_EVEN
HALVES = [{"g1": 100 + k, "g2": "h", "i": 1, "d": Decimal(v), "s": None, "f": None, "b": None,
           "e": BIG if j == 0 else Decimal("0.00")}
          for k, first in enumerate(["0.01", "-0.01"]) for j, v in
          enumerate([first] + ["0.00"] * 31)]


def history(rnd: random.Random) -> tuple[dict[int, dict], list[pa.Table]]:
    """A final table and the batches of signed change rows that lead to it."""
    table: dict[int, dict] = dict(enumerate(HALVES, start=HALF_PKS))
    batches = [[(+1, pk, row) for pk, row in table.items()]]
    for _ in range(12):
        batch = []
        for _ in range(rnd.randint(5, 40)):
            live = sorted(p for p in table if p < HALF_PKS)  # the halves stay as they are
            pk = rnd.choice(live) if live and rnd.random() < 0.6 else len(table) + rnd.randint(
                0, 10**6)
            if pk in table and rnd.random() < 0.3 and any(table[p]["d"] for p in live):
                pk = max((p for p in live if table[p]["d"] is not None),
                         key=lambda p: table[p]["d"], default=pk)  # the current max of d
            old = table.pop(pk, None)
            if old is not None:
                batch.append((-1, pk, old))
            if old is None or rnd.random() < 0.5:
                table[pk] = random_row(rnd)
                batch.append((+1, pk, table[pk]))
        batches.append(batch)
    return table, [_changes([c for c in b if passes(c[2])]) for b in batches]


def _changes(signed: list[tuple[int, int, dict]]) -> pa.Table:
    cols = {SIGN: [s for s, _, _ in signed], "g1": [r["g1"] for _, _, r in signed],
            "g2": [r["g2"] for _, _, r in signed], "id": [pk for _, pk, _ in signed]}
    for i in TABLES.args:
        cols[value_column(i)] = [r[AGGS[i].arg] for _, _, r in signed]
    return pa.Table.from_pydict(cols, schema=TABLES.change_schema)


def maintained(batches: list[pa.Table]) -> dict[tuple, dict]:
    state: dict[tuple, dict] = {}
    inputs: dict[tuple, dict] = {}
    mv: dict[tuple, dict] = {}
    for changes in batches:
        u = TABLES.apply(pa.Table.from_pylist(list(state.values()), TABLES.state_schema),
                         pa.Table.from_pylist(list(inputs.values()), TABLES.input_schema),
                         changes)
        for table, store, width in ((u.state_deletes, state, 2), (u.input_deletes, inputs, 3),
                                    (u.mv_deletes, mv, 2), (u.state_upserts, state, 2),
                                    (u.input_upserts, inputs, 3), (u.mv_upserts, mv, 2)):
            deleting = table.schema.names[-1] == "vnode" and len(table.schema) == width + 1
            for row in table.to_pylist():
                key = tuple(row.values())[:width]
                if deleting:
                    del store[key]
                else:
                    store[key] = row
    return mv


def test_state_mv_equals_sparks_group_by_in_type_and_value(spark) -> None:
    table, batches = history(random.Random(49))
    mv = maintained(batches)
    schema = pa.schema([pa.field(n, arrow_type(t)) for n, t in TYPES.items()])
    upstream = pa.Table.from_pylist(list(table.values()), schema)
    spark.createDataFrame(upstream).createOrReplaceTempView("agg_upstream")
    select = ", ".join(f"{text} AS {name}" for name, text in CALLS.items())
    got_spark = spark.sql(f"SELECT g1, g2, {select} FROM agg_upstream WHERE {FILTER} "
                          "GROUP BY g1, g2").toArrow()
    want_types = {f.name: f.type for f in TABLES.mv_schema if f.name != "vnode"}
    assert {f.name: f.type for f in got_spark.schema} == want_types
    spark_rows = {(r["g1"], r["g2"]): r for r in got_spark.to_pylist()}
    assert set(mv) == set(spark_rows)
    assert mv[(100, "h")]["avg_d"] == Decimal("0.000313")  # 0.0003125, HALF_UP
    assert mv[(101, "h")]["avg_d"] == Decimal("-0.000313")
    assert mv[(100, "h")]["avg_e"] == Decimal("312500000000000000000000000000.000313")
    for group, row in spark_rows.items():
        for name in CALLS:
            ours, theirs = mv[group][name], row[name]
            if isinstance(theirs, float) and CALLS[name].startswith(("sum(", "avg(")) \
                    and name not in ("avg_i",):  # Spark adds doubles in its own order
                values = [abs(float(r[CALLS[name][4:-1]])) for r in table.values()
                          if passes(r) and (r["g1"], r["g2"]) == group
                          and r[CALLS[name][4:-1]] is not None]
                bound = len(values) * 2.0**-52 * sum(values)
                assert ours == theirs or abs(ours - theirs) <= bound or (
                    math.isnan(ours) and math.isnan(theirs)), (group, name)
            else:
                assert ours == theirs or (ours != ours and theirs != theirs), (group, name)


def test_decimal_avg_rounds_once_at_the_result_scale(spark) -> None:
    """10^30 + 0.00000045 has 38 digits to the 7th decimal: a divide to 38 significant digits
    HALF_UP would round there first (…0000005, then …000001); Spark 4.2 divides to 39
    decimals rounding DOWN, so one HALF_UP rounding at scale 6 decides (…000000)."""
    big = "200000000000000000000000000000000000.09"
    (row,) = spark.sql(
        f"SELECT avg(CASE WHEN id = 0 THEN CAST('{big}' AS decimal(38,2)) "
        "ELSE CAST(0 AS decimal(38,2)) END) AS a FROM range(200000)").collect()
    plan = AggregatePlan.of((GroupColumn("g", "g"),), parse_aggregates({"a": "avg(v)"}),
                            {"g": "int", "a": "decimal(38,2)"})
    ours = exact_value(plan, 0, unscaled(Decimal(big), 2), 200000)
    assert ours == row["a"] == Decimal("1000000000000000000000000000000.000000")
