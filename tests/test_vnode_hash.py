"""The stable vnode hash: documented form, and Spark == plain Python on many keys of every type."""

from __future__ import annotations

import datetime as dt
import random
import zlib
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.arrow.types import arrow_type
from backfill_assets.core.errors import InvalidKeyType, InvalidKeyValue
from backfill_assets.core.keys import KeyColumn
from backfill_assets.core.vnode import (
    DEFAULT_VNODE_COUNT,
    canonical_key_text,
    spark_vnode_sql,
    vnode_of,
    vnodes_of,
)
from backfill_assets.storage import vnodes_for

UTC = dt.timezone.utc

# ---------------------------------------------------------------------------- key generators

EDGE = {
    "int": [0, 1, -1, 2**31 - 1, -(2**31), 42, -42, 1000000],
    "bigint": [0, -1, 2**63 - 1, -(2**63), 2**31, -(2**31) - 1, 10**15],
    "string": ["", "a", "A", " ", "héllo", "日本語", "emoji 🎉", "\x1f", "a\x1fb", "tab\tnl\n",
               "zero\u200bwidth", "e\u0301", "'quote\"", "\\back", "x" * 300],
    "date": [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31),
             dt.date(1970, 1, 1), dt.date(1582, 10, 4), dt.date(1582, 10, 15),
             dt.date(1900, 2, 28), dt.date(2000, 2, 29), dt.date(5, 3, 1), dt.date(999, 12, 31)],
    "timestamp": [dt.datetime(1970, 1, 1, tzinfo=UTC),
                  dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                  dt.datetime(1, 1, 1, tzinfo=UTC),
                  dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                  dt.datetime(2024, 2, 29, 12, 0, 0, 1, tzinfo=UTC),
                  dt.datetime(1900, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
                  dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)],
    "decimal(10,2)": [Decimal("0.00"), Decimal("-0.01"), Decimal("0.5"), Decimal("-12345678.99"),
                      Decimal("99999999.99"), Decimal("1"), Decimal("-0.00"), Decimal("100.10")],
    "decimal(38,10)": [Decimal("0"), Decimal("1234567890123456789012345678.0123456789"),
                       Decimal("-9999999999999999999999999999.9999999999"),
                       Decimal("0.0000000001"), Decimal("-0.0000000001")],
    "decimal(5,0)": [Decimal(0), Decimal(99999), Decimal(-99999), Decimal(7)],
    "decimal(18,18)": [Decimal("0.123456789012345678"), Decimal("-0.000000000000000001"),
                       Decimal("0")],
}


def random_value(rng: random.Random, typ: str):
    if rng.random() < 0.1:
        return rng.choice(EDGE[typ])
    if typ == "int":
        return rng.randint(-(2**31), 2**31 - 1)
    if typ == "bigint":
        return rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000)])
    if typ == "string":
        alphabet = "abcXYZ019 _-é日本🎉\x1f\u0301"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if typ == "date":
        return dt.date(1, 1, 1) + dt.timedelta(days=rng.randint(0, 3652058))
    if typ == "timestamp":
        micros = rng.randint(-62135596800000000, 253402300799999999)
        return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros)
    p, s = (int(x) for x in typ[len("decimal("):-1].split(","))
    digits = rng.randint(0, 10**p - 1) * rng.choice([1, -1])
    return Decimal(digits).scaleb(-s)


KEY_SHAPES = [
    ("int",), ("bigint",), ("string",), ("date",), ("timestamp",), ("decimal(10,2)",),
    ("decimal(38,10)",), ("decimal(5,0)",), ("decimal(18,18)",),
    ("string", "bigint"),
    ("date", "decimal(10,2)", "timestamp"),
    ("int", "string", "date", "timestamp", "decimal(38,10)", "bigint"),
]


def keys_for(types: tuple[str, ...], n: int, seed: int) -> list[tuple]:
    rng = random.Random(f"{seed}/{types}")
    keys = [tuple(random_value(rng, t) for t in types) for _ in range(n)]
    if len(types) == 1:
        keys += [(v,) for v in EDGE[types[0]]]
    return keys


def arrow_keys(types: tuple[str, ...], keys: list[tuple]) -> pa.Table:
    return pa.table({f"k{i}": pa.array([k[i] for k in keys], arrow_type(t))
                     for i, t in enumerate(types)})


# ---------------------------------------------------------------------------- pure Python side


def test_documented_form():
    """crc32 of the UTF-8 of the \\x1f-joined canonical texts, mod the vnode count."""
    key = ("héllo", -5, dt.date(2024, 1, 2),
           dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC), Decimal("-0.50"))
    types = ("string", "bigint", "date", "timestamp", "decimal(6,2)")
    text = canonical_key_text(key, types)
    assert text == "héllo\x1f-5\x1f2024-01-02\x1f1000005\x1f-0.50"
    assert vnode_of(key, types, 256) == zlib.crc32(text.encode("utf-8")) % 256
    # frozen values: changing them re-partitions every table the platform ever wrote
    assert vnode_of((1,), ["bigint"], 256) == zlib.crc32(b"1") % 256 == 183
    assert vnode_of(("a", 5), ["string", "bigint"], 256) == 184
    assert DEFAULT_VNODE_COUNT == 256


def test_canonical_texts():
    assert canonical_key_text((Decimal("-0.00"),), ["decimal(5,2)"]) == "0.00"
    assert canonical_key_text((Decimal("1.5"),), ["decimal(5,2)"]) == "1.50"
    assert canonical_key_text((7,), ["decimal(5,2)"]) == "7.00"
    assert canonical_key_text((Decimal("1E+3"),), ["decimal(6,0)"]) == "1000"
    assert canonical_key_text((dt.date(5, 3, 1),), ["date"]) == "0005-03-01"
    naive = dt.datetime(2020, 1, 1)
    aware = dt.datetime(2020, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    ts = ["timestamp"]
    assert canonical_key_text((naive,), ts) == canonical_key_text((aware,), ts)
    assert canonical_key_text((dt.datetime(1969, 12, 31, 23, 59, 59, 999999),), ts) == "-1"


@pytest.mark.parametrize("key,types", [
    ((True,), ["int"]), ((2**31,), ["int"]), (("1",), ["bigint"]), ((1,), ["string"]),
    ((dt.datetime(2020, 1, 1),), ["date"]), ((dt.date(2020, 1, 1),), ["timestamp"]),
    ((Decimal("1.234"),), ["decimal(5,2)"]), ((Decimal("1234"),), ["decimal(5,2)"]),
    ((1.5,), ["decimal(5,2)"]), ((None,), ["int"]), ((1, 2), ["int"]),
])
def test_rejects_bad_values(key, types):
    with pytest.raises(InvalidKeyValue):
        vnode_of(key, types, 16)


@pytest.mark.parametrize("typ", ["double", "boolean", "decimal(39,1)", "decimal(5,6)", "varchar"])
def test_rejects_bad_key_types(typ):
    with pytest.raises(InvalidKeyType):
        canonical_key_text((1,), [typ])


@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20)), max_size=50),
       st.integers(1, 4096))
def test_vectorised_helpers_match(keys, n):
    types = ["bigint", "string"]
    expected = [vnode_of(k, types, n) for k in keys]
    assert vnodes_of(keys, types, n) == expected
    assert all(0 <= v < n for v in expected)
    table = pa.table({"a": pa.array([k[0] for k in keys], pa.int64()),
                      "b": pa.array([k[1] for k in keys], pa.string())})
    cols = [KeyColumn("a", "bigint"), KeyColumn("b", "string")]
    assert vnodes_for(table, cols, n).to_pylist() == expected


def test_spark_sql_text():
    sql = spark_vnode_sql(["a", "b c"], ["string", "decimal(10, 2)"], 64)
    assert sql == ("CAST(PMOD(CRC32(CAST(CONCAT_WS(CHAR(31), a, CAST(`b c` AS STRING)) AS BINARY)),"
                   " 64) AS INT)")


# ------------------------------------------------------------------------------- Spark == Python


@pytest.mark.spark
@pytest.mark.parametrize("types", KEY_SHAPES, ids=lambda t: "+".join(t))
def test_spark_equals_python(spark, types):
    from backfill_assets.engine.netting import vnode_column
    from backfill_assets.storage import spark_schema

    keys = keys_for(types, 400, seed=len(types))
    table = arrow_keys(types, keys).append_column("i", pa.array(range(len(keys)), pa.int64()))
    df = spark.createDataFrame(table, schema=spark_schema(table.schema))
    cols = [KeyColumn(f"k{i}", t) for i, t in enumerate(types)]
    for count in (256, 7, 1):
        rows = df.select("i", vnode_column(cols, count).alias("v")).toArrow()
        got = dict(zip(rows.column("i").to_pylist(), rows.column("v").to_pylist(), strict=True))
        expected = {i: vnode_of(k, types, count) for i, k in enumerate(keys)}
        assert got == expected, [(keys[i], got[i], expected[i]) for i in expected
                                 if got[i] != expected[i]][:5]


@pytest.mark.spark
def test_spark_canonical_text_equals_python(spark):
    """The texts themselves (not only their hashes) agree, for the edge values of each type."""
    from backfill_assets.core.vnode import spark_key_text_sql
    from backfill_assets.storage import spark_schema

    for typ, values in EDGE.items():
        table = pa.table({"k": pa.array(values, arrow_type(typ))})
        df = spark.createDataFrame(table, schema=spark_schema(table.schema))
        texts = df.selectExpr(f"{spark_key_text_sql('k', typ)} AS t").toArrow()
        assert texts.column("t").to_pylist() == [canonical_key_text((v,), [typ]) for v in values]
