"""Key types, key order and bounds (the Spark SQL text: test_key_sql.py)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from backfill_assets.core.errors import InvalidKeyType, InvalidKeyValue, InvalidMVDefinition
from backfill_assets.core.keys import (
    Bound,
    KeyColumn,
    KeyOrder,
    compute_bounds,
    decimal_precision_scale,
    normalize_value,
    parse_key_type,
    to_utc,
)

UTC = dt.UTC
PLUS5 = dt.timezone(dt.timedelta(hours=5))
KO = KeyOrder(
    (
        KeyColumn("i", "int"),
        KeyColumn("s", "string", descending=True, nulls_first=True),
        KeyColumn("d", "date"),
        KeyColumn("m", "decimal(6,2)", descending=True),
        KeyColumn("t", "timestamp"),
    )
)


# --- parse_key_type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_type", "expected"),
    [
        ("int", "int"), ("INT", "int"), ("integer", "int"), ("bigint", "bigint"),
        ("long", "bigint"), ("string", "string"), ("date", "date"),
        ("timestamp", "timestamp"), (" Decimal( 10 , 2 ) ", "decimal(10,2)"),
        ("decimal(1,0)", "decimal(1,0)"), ("decimal(38,38)", "decimal(38,38)"),
        ("decimal(007,2)", "decimal(7,2)"),
    ],
)
def test_parse_key_type_accepts_supported_spellings(given_type, expected) -> None:
    assert parse_key_type(given_type) == expected


@pytest.mark.parametrize(
    "bad", ["float", "double", "boolean", "timestamp_ntz", "decimal(0,0)", "decimal(39,2)",
            "decimal(5,6)", "decimal", "array<int>"]
)
def test_parse_key_type_refuses_unsupported_types(bad) -> None:
    with pytest.raises(InvalidKeyType) as e:
        parse_key_type(bad, "price")
    msg = str(e.value)
    assert repr(bad) in msg and "'price'" in msg
    assert "int, bigint, string, date, timestamp, decimal(p,s)" in msg
    assert "cast the column" in msg


@pytest.mark.parametrize("missing", ["", "  ", None])
def test_parse_key_type_explains_an_unknown_type(missing) -> None:
    with pytest.raises(InvalidKeyType, match="is unknown.*resolve it from the upstream"):
        parse_key_type(missing, "id")  # type: ignore[arg-type]


def test_decimal_precision_scale() -> None:
    assert decimal_precision_scale("decimal(12,3)") == (12, 3)
    with pytest.raises(InvalidKeyType, match="not a decimal"):
        decimal_precision_scale("int")


# --- values -----------------------------------------------------------------------------------


def test_to_utc_treats_naive_as_utc_and_converts_other_zones() -> None:
    naive = dt.datetime(2024, 1, 1, 12)
    assert to_utc(naive) == dt.datetime(2024, 1, 1, 12, tzinfo=UTC)
    assert to_utc(naive.replace(tzinfo=PLUS5)).hour == 7
    assert to_utc(naive.replace(tzinfo=PLUS5)).tzinfo is UTC


@pytest.mark.parametrize(
    ("col_type", "value"),
    [
        ("int", 2**31 - 1), ("int", -(2**31)), ("bigint", 2**63 - 1), ("string", ""),
        ("date", dt.date(1, 1, 1)), ("decimal(5,2)", Decimal("-999.99")),
        ("decimal(5,2)", Decimal("1.5")), ("decimal(5,2)", Decimal("0.000")),
        ("decimal(5,2)", Decimal("1E+1")),
    ],
)
def test_normalize_value_accepts_values_of_the_type(col_type, value) -> None:
    assert normalize_value(KeyColumn("c", col_type), value) == value


@pytest.mark.parametrize(
    ("col_type", "value"),
    [
        ("int", True), ("int", 2**31), ("int", 1.0), ("int", "1"), ("bigint", 2**63),
        ("string", 1), ("date", dt.datetime(2024, 1, 1)), ("date", "2024-01-01"),
        ("timestamp", dt.date(2024, 1, 1)), ("decimal(5,2)", 1.5),
        ("decimal(5,2)", Decimal("1.234")), ("decimal(5,2)", Decimal("1000.00")),
        ("decimal(5,2)", Decimal("NaN")), ("decimal(5,2)", Decimal("1E+100")),
        ("int", None),
    ],
)
def test_normalize_value_refuses_values_of_another_type(col_type, value) -> None:
    with pytest.raises(InvalidKeyValue) as e:
        normalize_value(KeyColumn("c", col_type), value)
    assert "'c'" in str(e.value) and col_type in str(e.value)
    assert "fix the data" in str(e.value)


def test_normalize_value_returns_timestamps_in_utc() -> None:
    got = normalize_value(KeyColumn("t", "timestamp"), dt.datetime(2024, 1, 1, tzinfo=PLUS5))
    assert got == dt.datetime(2023, 12, 31, 19, tzinfo=UTC) and got.tzinfo is UTC


# --- KeyOrder construction --------------------------------------------------------------------


def test_key_order_normalizes_column_types() -> None:
    ko = KeyOrder((KeyColumn("a", "INTEGER"), KeyColumn("b", "decimal(10, 2)", True, True)))
    assert ko.columns == (KeyColumn("a", "int"), KeyColumn("b", "decimal(10,2)", True, True))
    assert ko.names == ("a", "b")
    assert ko.column("b").descending


def test_key_order_refuses_empty_duplicate_and_bad_types() -> None:
    with pytest.raises(InvalidMVDefinition, match="no column: declare primary_key"):
        KeyOrder(())
    with pytest.raises(InvalidMVDefinition, match=r"\['a'\] more than once"):
        KeyOrder((KeyColumn("a", "int"), KeyColumn("a", "string")))
    with pytest.raises(InvalidKeyType, match="'float'"):
        KeyOrder((KeyColumn("a", "float"),))


def test_column_lookup_refuses_unknown_names() -> None:
    with pytest.raises(InvalidKeyValue, match=r"'zz' is not a pk column; pk columns are \['i'"):
        KO.column("zz")


def test_placeholder() -> None:
    assert KO.placeholder() == (None,) * 5
    assert KO.is_placeholder(KO.placeholder())
    assert not KO.is_placeholder(None)
    assert not KO.is_placeholder((None,))
    assert not KO.is_placeholder((1, None, None, None, None))


@pytest.mark.parametrize("bad", [[1, "a"], (1,), (1, 2, 3), "ab", None])
def test_normalize_refuses_wrong_arity(bad) -> None:
    ko = KeyOrder((KeyColumn("a", "int"), KeyColumn("b", "string")))
    with pytest.raises(InvalidKeyValue, match=r"must be a tuple of 2 values.*\['a', 'b'\]"):
        ko.normalize(bad)


def test_normalize_converts_timestamps_so_keys_hash_alike() -> None:
    ko = KeyOrder((KeyColumn("t", "timestamp"),))
    naive = (dt.datetime(2024, 1, 1),)
    shifted = (dt.datetime(2024, 1, 1, 5, tzinfo=PLUS5),)
    assert ko.normalize(naive) == ko.normalize(shifted)
    assert hash(ko.normalize(naive)) == hash(ko.normalize(shifted))


# --- compare ----------------------------------------------------------------------------------


def one(col_type: str, descending=False, nulls_first=False) -> KeyOrder:
    return KeyOrder((KeyColumn("c", col_type, descending, nulls_first),))


@pytest.mark.parametrize(
    ("descending", "nulls_first", "ordered"),
    [
        (False, False, [(1,), (2,), (None,)]),
        (False, True, [(None,), (1,), (2,)]),
        (True, False, [(2,), (1,), (None,)]),
        (True, True, [(None,), (2,), (1,)]),
    ],
)
def test_compare_direction_and_null_placement(descending, nulls_first, ordered) -> None:
    ko = one("int", descending, nulls_first)
    for i, a in enumerate(ordered):
        for j, b in enumerate(ordered):
            assert ko.compare(a, b) == (i > j) - (i < j)
    assert sorted(reversed(ordered), key=ko.sort_key) == ordered


def test_compare_is_lexicographic() -> None:
    ko = KeyOrder((KeyColumn("a", "int"), KeyColumn("b", "string", descending=True)))
    assert ko.compare((1, "z"), (2, "a")) == -1
    assert ko.compare((1, "z"), (1, "a")) == -1
    assert ko.compare((1, "a"), (1, "a")) == 0
    assert ko.max_key([(1, "z"), (2, "b"), (2, "a")]) == (2, "a")
    with pytest.raises(ValueError):
        ko.max_key([])


def test_compare_mixes_naive_and_aware_timestamps() -> None:
    ko = one("timestamp")
    assert ko.compare((dt.datetime(2024, 1, 1, 1),),
                      (dt.datetime(2024, 1, 1, 5, tzinfo=PLUS5),)) == 1
    assert ko.compare((dt.datetime(2024, 1, 1),), (dt.datetime(2024, 1, 1, tzinfo=UTC),)) == 0


def test_compare_refuses_values_of_different_types() -> None:
    with pytest.raises(InvalidKeyValue, match="cannot compare 1 with 'a' in pk column 'c'"):
        one("int").compare((1,), ("a",))
    with pytest.raises(InvalidKeyValue, match="must be a tuple of 1 values"):
        one("int").compare((1,), (1, 2))


# --- bounds -----------------------------------------------------------------------------------


def test_compute_bounds() -> None:
    assert compute_bounds(None) == Bound(None)
    assert compute_bounds([1, "a"]) == Bound((1, "a"))
    assert compute_bounds((None, None)) == Bound((None, None), empty=True)
    ko = one("int")
    assert compute_bounds(None).admits(ko, (-5,))
    assert compute_bounds((3,)).admits(ko, (4,))
    assert not compute_bounds((3,)).admits(ko, (3,))
    assert not compute_bounds((None,)).admits(ko, (4,))
    assert compute_bounds(None).predicate(ko) == "TRUE"
    assert compute_bounds((None,)).predicate(ko) == "FALSE"
    assert compute_bounds((3,)).predicate(ko, "s") == "(s.`c` > 3)"
