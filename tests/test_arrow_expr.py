"""The Arrow evaluation of MV definitions against Spark's, the independent oracle.

Generated expressions of the supported subset over generated rows (nulls, integer extremes,
non-ASCII text) are evaluated by Spark's path (`mv_spark.project`, the filter as KEEP) and by
`arrow_expr`: where the definition compiles and Arrow does not refuse the rows (`NotExact`),
the MV rows must be Spark's exactly, values and types, in the same order; where Spark fails
(an ANSI overflow), Arrow must have refused. Most generated definitions must compile.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from backfill_assets.arrow_expr import NotExact, compile_projection
from backfill_assets.core.expressions import Binary, Call, Column, IsNull, Literal, Unary, parse
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv_spark import KEEP, project, validate_expressions
from backfill_assets.storage.spark_types import spark_schema

SCHEMA = pa.schema([("id", pa.int64()), ("b", pa.int8()), ("s", pa.int16()),
                    ("Qty", pa.int32()), ("big", pa.int64()), ("amount", pa.decimal128(12, 2)),
                    ("rate", pa.decimal128(5, 4)), ("my name", pa.string()),
                    ("flag", pa.bool_()), ("day", pa.date32()), ("vnode", pa.int32())])
INTS = {"b": 8, "s": 16, "Qty": 32, "big": 64}
COLUMNS = {"int": ["b", "s", "Qty", "big", "id"], "dec": ["amount", "rate"],
           "str": ["`my name`"], "bool": ["flag"], "date": ["day"]}


def _int(bits: int):
    return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


ROW = st.fixed_dictionaries({
    "b": st.one_of(st.none(), _int(8)), "s": st.one_of(st.none(), _int(16)),
    "Qty": st.one_of(st.none(), _int(32), st.integers(-5, 5)),
    "big": st.one_of(st.none(), _int(64), st.integers(-5, 5)),
    "amount": st.one_of(st.none(), st.decimals(-10**10 + 1, 10**10 - 1, places=2,
                                                allow_nan=False, allow_infinity=False)),
    "rate": st.one_of(st.none(), st.decimals(-9, 9, places=4, allow_nan=False,
                                              allow_infinity=False)),
    "my name": st.one_of(st.none(), st.sampled_from(["", "abc", "Zürich", "straße", "ok x"])),
    "flag": st.one_of(st.none(), st.booleans()),
    "day": st.one_of(st.none(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
})


def _numeric(depth: int):
    leaf = st.one_of(st.sampled_from(COLUMNS["int"] + COLUMNS["dec"]),
                     st.integers(-3, 3).map(str), st.sampled_from(["1.5", "0.05", "10.00"]))
    if depth == 0:
        return leaf
    sub = _numeric(depth - 1)
    return st.one_of(leaf, st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub)
                     .map(lambda t: f"({t[0]} {t[1]} {t[2]})"), sub.map(lambda e: f"-{e}"))


def _boolean(depth: int):
    cmp = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])
    leaf = st.one_of(
        st.tuples(_numeric(1), cmp, _numeric(1)).map(" ".join),
        st.tuples(st.just("`my name`"), cmp, st.sampled_from(["'abc'", "''", "'b'"]))
        .map(" ".join),
        st.just("flag"), st.just("day >= day"),
        st.sampled_from(COLUMNS["int"] + COLUMNS["str"]).map(lambda c: f"{c} IS NOT NULL"),
        st.just("upper(`my name`) = 'ABC'"))
    if depth == 0:
        return leaf
    sub = _boolean(depth - 1)
    return st.one_of(leaf, st.tuples(sub, st.sampled_from(["AND", "OR"]), sub)
                     .map(lambda t: f"({t[0]} {t[1]} {t[2]})"), sub.map(lambda e: f"NOT {e}"))


COMPUTED = st.one_of(_numeric(2), _boolean(1), st.just("upper(`my name`)"),
                     st.just("lower(`my name`)"))


def _definition(filter_: str | None, computed: list[str]) -> MVDefinition:
    return MVDefinition.from_dict({
        "name": "arrow_mv", "upstream": "up", "primary_key": ["id"],
        "columns": ["id", "Qty", "my name", "day"], "filter": filter_,
        "computed": [{"name": f"c{i}", "expr": e} for i, e in enumerate(computed)]})


def _spark_rows(spark, d: MVDefinition, table: pa.Table) -> pa.Table:
    df = spark.createDataFrame(table, schema=spark_schema(table.schema))
    return project(df, d).where(F.col(KEEP)).drop(KEEP).toArrow()


_SEEN = {"compiled": 0, "total": 0}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filter_=st.one_of(st.none(), _boolean(2)), computed=st.lists(COMPUTED, min_size=1,
                                                                     max_size=3),
       rows=st.lists(ROW, max_size=12))
def test_arrow_rows_are_sparks(spark, filter_, computed, rows):
    d = _definition(filter_, computed)
    table = pa.Table.from_pylist([{**r, "id": i, "vnode": i % 4} for i, r in enumerate(rows)],
                                 SCHEMA)
    try:
        mv_schema = validate_expressions(spark, d, SCHEMA)
    except Exception:  # noqa: BLE001 - Spark refuses the expression (type error): not ours
        return
    exact = compile_projection(d, SCHEMA, mv_schema)
    _SEEN["total"] += 1
    if exact is None:
        return
    _SEEN["compiled"] += 1
    try:
        ours = exact.project(table)
    except NotExact:
        return
    theirs = _spark_rows(spark, d, table)  # Spark failing here is a value we did not refuse
    assert ours.schema.types == [f.type for f in mv_schema]
    assert ours.cast(theirs.schema).to_pylist() == theirs.to_pylist()


def test_most_generated_definitions_compile():
    """Runs after the property test (file order): the subset is not a corner case."""
    if _SEEN["total"] < 20:
        pytest.skip("the property test did not run in this process")
    assert _SEEN["compiled"] >= _SEEN["total"] // 2, _SEEN


def test_the_platform_definition_compiles_and_refuses_non_ascii(spark):
    up = pa.schema([("region", pa.string()), ("id", pa.int64()), ("name", pa.string()),
                    ("amount", pa.decimal128(12, 2)), ("qty", pa.int32()),
                    ("ts", pa.timestamp("us", "UTC")), ("flag", pa.bool_()),
                    ("vnode", pa.int32())])
    d = MVDefinition.from_dict({
        "name": "orders_mv", "upstream": "up", "primary_key": ["id"],
        "columns": ["id", "region", "name", "amount", "qty", "ts"],
        "filter": "qty > 0 AND NOT flag",
        "computed": [{"name": "total", "expr": "amount * qty"},
                     {"name": "name_upper", "expr": "upper(name)"}]})
    exact = compile_projection(d, up, validate_expressions(spark, d, up))
    assert exact is not None
    ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [{"region": "eu", "id": i, "name": f"n{i}", "amount": Decimal("12.34") * i,
             "qty": i - 2, "ts": ts, "flag": i % 3 == 0, "vnode": i % 4} for i in range(30)]
    table = pa.Table.from_pylist(rows + [{**rows[1], "id": 99, "flag": None}], up)
    theirs = _spark_rows(spark, d, table)
    assert exact.project(table).to_pylist() == theirs.to_pylist()
    assert exact.project(table).schema.types == theirs.schema.types
    with pytest.raises(NotExact, match="non-ASCII"):
        exact.project(pa.Table.from_pylist([{**rows[5], "name": "straße"}], up))


@pytest.mark.parametrize("text, expected", [
    ("qty > 0 AND NOT flag", Binary(">", Column("qty", False), Literal(0, "int"))),
    ("`a b` * 2", Binary("*", Column("a b", True), Literal(2, "int"))),
    ("UPPER(name)", Call("upper", (Column("name", False),))),
    ("x IS NOT NULL", IsNull(Column("x", False), True)),
    ("-x", Unary("-", Column("x", False))),
])
def test_parse(text, expected):
    node = parse(text)
    assert node == expected or (isinstance(node, Binary) and node.left == expected)


@pytest.mark.parametrize("text", [
    "a / b", "1e3", "1L", "'it\\'s'", "\"dq\"", "abs(x)", "a.b", "a = b = c", "x IS 1",
    "CASE WHEN a THEN 1 END", "a <=> b", "a BETWEEN 1 AND 2", "a IN (1, 2)", "'a' 'b'",
    "(a", "a)", "", "null", "concat(a, b)", "upper(a, b)", ".5",
])
def test_outside_the_subset_is_none(text):
    assert parse(text) is None
