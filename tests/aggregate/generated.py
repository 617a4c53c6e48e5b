"""Generated aggregate MVs over a Delta-Spark upstream, for the property tests of the
aggregate path (tests/aggregate/test_aggregate_generated.py, test_aggregate_random_kills.py).

The upstream is a `SparkUpstream` (created and changed only through Delta-Spark SQL: UPDATE,
DELETE, MERGE, INSERT, pk moves, with deletion vectors, the change feed and column mapping) whose
column names need column mapping (spaces, accents), whose values hold the edges the aggregate
algebra must keep exact (38-digit decimals, the smallest decimal step, avg's rounding, NaN and
-0.0, nulls in group keys and arguments), and whose groups are few, so DML moves rows between
groups, empties groups and re-adds them. The MV's definition is drawn from a seed: group keys,
a filter or none, a subset of aggregates.

The second oracle (`assert_as_delta_spark_groups`) shares nothing with the platform's readers:
Delta-Spark reads the upstream at the recorded version (`versionAsOf`), Spark SQL runs the
definition's GROUP BY, and the MV is read by Delta-Spark too.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from decimal import Decimal

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.verify.aggregate_oracle import aggregate_query
from tests.foreign import spark_quote
from tests.interop.delta_spark import recorded_versions
from tests.interop.spark_upstream import Features, SparkUpstream, sql_literal

KEY = "clé id"
COLUMNS = {KEY: "bigint", "ré gion": "string", "día": "date", "mónto": "decimal(38,10)",
           "q ty": "int", "ratio": "double", "price": "decimal(5,2)"}
REGIONS = ("north", "España", "日 本", "", None)
DAYS = (dt.date(2024, 2, 29), dt.date(1, 1, 1), dt.date(9999, 12, 31), None)
AMOUNTS = (Decimal("99999999999999999999.9999999999"), Decimal("-0.0000000001"),
           Decimal("0.0000000001"), Decimal("0E-10"), Decimal("-12345678901234567.5000000005"),
           None)
RATIOS = (0.1, -0.0, 0.0, 1e300, -1e-300, float("nan"), None)
PRICES = (Decimal("999.99"), Decimal("-999.99"), Decimal("0.01"), Decimal("0.02"), None)
# output name -> aggregate: every function, odd names, types at their edges
AGGREGATES = {"n rows": "count(*)", "n_qty": "count(`q ty`)", "Σ mónto": "sum(`mónto`)",
              "avg mónto": "avg(`mónto`)", "min mónto": "min(`mónto`)",
              "max mónto": "max(`mónto`)", "sum qty": "sum(`q ty`)", "avg qty": "avg(`q ty`)",
              "max ratio": "max(ratio)", "min ratio": "min(ratio)", "sum ratio": "sum(ratio)",
              "avg price": "avg(price)", "distinct price": "count(DISTINCT price)",
              "first día": "min(`día`)", "last region": "max(`ré gion`)",
              "distinct regions": "count(DISTINCT `ré gion`)"}
GROUPINGS = (["`ré gion`"], ["`ré gion`", "`día`"], [{"name": "bucket", "expr": "`q ty` % 3"}],
             ["`día`", {"name": "sign", "expr": "CAST(signum(price) AS INT)"}])
FILTERS = (None, "`q ty` IS NULL OR `q ty` <> 4", "price > -500")


def make_row(rng: random.Random, _key: object) -> dict:
    """Values of the edges; the key is the upstream's to mint."""
    amount = rng.choice(AMOUNTS) if rng.random() < 0.5 else \
        Decimal(rng.randint(-10**12, 10**12)) / 10**7
    return {"ré gion": rng.choice(REGIONS), "día": rng.choice(DAYS), "mónto": amount,
            "q ty": rng.choice([None, *range(-3, 9)]),
            "ratio": rng.choice(RATIOS) if rng.random() < 0.5 else rng.uniform(-1e3, 1e3),
            "price": rng.choice(PRICES) if rng.random() < 0.4 else
            Decimal(rng.randint(-99999, 99999)) / 100}


def generated_upstream(spark, uri: str, seed: int, rows: int) -> SparkUpstream:
    rng = random.Random(seed)
    features = Features(mapping=rng.choice(["name", "id"]), dvs=rng.random() < 0.8,
                        checkpoints=rng.choice(["classic", "default"]))
    up = SparkUpstream(spark, uri, features, rng, dict(COLUMNS), key=KEY, make_row=make_row)
    up.create(rows)
    return up


def generated_raw(name: str, upstream: str, seed: int, vnode_count: int = 4, **extra) -> dict:
    """An aggregate MV drawn from ``seed``: its group keys, filter and aggregates."""
    rng = random.Random(seed)
    names = rng.sample(sorted(AGGREGATES), rng.randint(4, len(AGGREGATES)))
    filter_ = rng.choice(FILTERS)
    return {"name": name, "upstream": upstream, "primary_key": [KEY],
            **({"filter": filter_} if filter_ else {}),
            "group_by": rng.choice(GROUPINGS),
            "aggregates": {n: AGGREGATES[n] for n in ["n rows", *names]},
            "vnode_count": vnode_count, **extra}


# ---------------------------------------------------------------------------- the DML


def _sync_keys(up: SparkUpstream) -> None:
    """Read the live keys back after a DML aimed by predicate."""
    read = up.spark.read.format("delta").load(up.uri).select(spark_quote(KEY))
    up.keys = set(read.toArrow().column(0).to_pylist())


def delete_extreme(up: SparkUpstream, column: str = "mónto", top: bool = True) -> None:
    """DELETE the rows holding the column's current maximum (or minimum)."""
    q = spark_quote(column)
    pick = "max" if top else "min"
    value = up.spark.sql(f"SELECT {pick}({q}) FROM {up.table}").collect()[0][0]
    if value is not None:
        up.sql(f"DELETE FROM {up.table} WHERE {q} = {sql_literal(COLUMNS[column], value)}")
    _sync_keys(up)


def empty_group(up: SparkUpstream, region: str | None, readd: int = 0) -> None:
    """DELETE every row of a region (its groups vanish), then, as another commit of the same
    barrier, INSERT ``readd`` fresh rows into it (the group comes back with other rows)."""
    q = spark_quote("ré gion")
    where = f"{q} IS NULL" if region is None else f"{q} = {sql_literal('string', region)}"
    up.sql(f"DELETE FROM {up.table} WHERE {where}")
    _sync_keys(up)
    if readd:
        rows = [{**up.row(), "ré gion": region} for _ in range(readd)]
        up.frame(rows).write.format("delta").mode("append").save(up.uri)


def regroup_in_one_merge(up: SparkUpstream, region: str) -> None:
    """One MERGE that deletes every row of a region and inserts new ones into it: the group
    is emptied and re-filled inside a single commit."""
    q = spark_quote("ré gion")
    where = f"{q} = {sql_literal('string', region)}"
    gone = up.spark.read.format("delta").load(up.uri).where(where)
    keys = gone.select(spark_quote(KEY)).toArrow().column(0).to_pylist()
    rows = [{**up.row(k), "op": "D"} for k in keys]
    rows += [{**up.row(), "ré gion": region, "op": "I"} for _ in range(2)]
    up.frame(rows, {"op": "string"}).createOrReplaceTempView("regroup_batch")
    k = spark_quote(KEY)
    up.sql(f"MERGE INTO {up.table} t USING regroup_batch s ON t.{k} = s.{k} "
           "WHEN MATCHED AND s.op = 'D' THEN DELETE WHEN NOT MATCHED THEN INSERT *")
    _sync_keys(up)


def random_step(up: SparkUpstream, rng: random.Random) -> list[str]:
    """One barrier's worth of DML: the upstream's random DML, plus one of the edge moves."""
    up.random_dml(rng.randint(1, 3))
    move = rng.choice(["extreme", "floor", "empty", "readd", "merge", "none"])
    if move == "extreme":
        delete_extreme(up)
    elif move == "floor":
        delete_extreme(up, "price", top=False)
    elif move == "empty":
        empty_group(up, rng.choice(REGIONS))
    elif move == "readd":
        empty_group(up, rng.choice(REGIONS), readd=rng.randint(1, 3))
    elif move == "merge":
        regroup_in_one_merge(up, rng.choice(REGIONS[:4]))
    return [*up.done[-3:], move]


# --------------------------------------------------------------------- the second oracle


def _comparable(row: dict) -> tuple:
    """A row as a sortable tuple; floats to ten significant digits (the float bound)."""
    out = []
    for k in sorted(row):
        v = row[k]
        if isinstance(v, float) and math.isfinite(v):
            v = float(f"{v:.10g}") + 0.0  # -0.0 is 0.0 (see verify/aggregate_oracle.py)
        out.append((k, repr(v)))
    return tuple(out)


def assert_as_delta_spark_groups(spark, d: MVDefinition, uri: str, mv_uri: str, tables) -> int:
    """Delta-Spark's GROUP BY of the upstream at the recorded version == Delta-Spark's read of
    the MV (its outputs), as multisets; the groups compared."""
    versions = recorded_versions(spark, tables)
    assert len(versions) == 1, f"upstream vnodes at several versions: {versions}"
    version = versions.pop()
    view = "delta_spark_oracle_upstream"
    spark.read.format("delta").option("versionAsOf", version).load(uri) \
        .createOrReplaceTempView(view)
    want = [r.asDict() for r in spark.sql(aggregate_query(d, view)).collect()]
    outputs = [*(g.name for g in d.group_by), *(a.name for a in d.aggregates)]
    have = [r.asDict() for r in spark.read.format("delta").load(mv_uri)
            .select(*[spark_quote(c) for c in outputs]).collect()]
    expected = Counter(_comparable(r) for r in want)
    actual = Counter(_comparable(r) for r in have)
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (f"MV != Delta-Spark's GROUP BY at v{version}: "
                                       f"missing {list(missing)[:2]}, extra {list(extra)[:2]}")
    return len(want)
