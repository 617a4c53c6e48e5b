"""The Spark SQL text of key orders and bounds, checked by evaluating it against `compare`."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import InvalidKeyValue
from backfill_assets.core.keys import (
    KeyColumn,
    KeyOrder,
    compute_bounds,
)
from tests.core.test_keys import KO, PLUS5, UTC, one

# --- SQL text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("col_type", "value", "sql"),
    [
        ("int", -5, "-5"),
        ("bigint", 2**62, str(2**62)),
        ("string", "it's", "'it''s'"),
        ("string", "back\\slash", "'back\\\\slash'"),
        ("string", "\\'", "'\\\\'''"),
        ("date", dt.date(33, 2, 1), "DATE '0033-02-01'"),
        ("timestamp", dt.datetime(2024, 3, 4, 5, 6, 7, 89, tzinfo=PLUS5),
         "TIMESTAMP '2024-03-04 00:06:07.000089'"),
        ("timestamp", dt.datetime(999, 1, 1), "TIMESTAMP '0999-01-01 00:00:00.000000'"),
        ("decimal(6,2)", Decimal("-12.5"), "CAST('-12.5' AS DECIMAL(6,2))"),
        ("decimal(6,2)", Decimal("1E+1"), "CAST('10' AS DECIMAL(6,2))"),
        ("int", None, "NULL"),
    ],
)
def test_sql_literal(col_type, value, sql) -> None:
    ko = one(col_type)
    assert ko.sql_literal("c", value) == sql
    assert ko.sql_literal(ko.columns[0], value) == sql


def test_sql_literal_refuses_bad_values() -> None:
    with pytest.raises(InvalidKeyValue):
        one("int").sql_literal("c", "1; DROP TABLE t")


def test_sql_after_and_at_or_before_text() -> None:
    ko = KeyOrder((KeyColumn("a", "int"), KeyColumn("b`x", "string", descending=True)))
    assert ko.sql_after((1, "q")) == "(`a` > 1 OR (`a` = 1 AND (`b``x` < 'q')))"
    assert ko.sql_at_or_before((1, "q"), "t") == (
        "(t.`a` < 1 OR (t.`a` = 1 AND (t.`b``x` >= 'q')))"
    )
    assert one("int").sql_at_or_before((3,)) == "(`c` <= 3)"


def test_sql_against_position_columns() -> None:
    ko = KeyOrder((KeyColumn("a", "int"), KeyColumn("b`x", "string", descending=True)))
    assert ko.position_columns("_p_") == ["_p_a", "_p_b`x"]
    assert ko.sql_after_columns("_p_") == (
        "(`a` > `_p_a` OR (`a` = `_p_a` AND (`b``x` < `_p_b``x`)))"
    )
    assert one("int").sql_at_or_before_columns("_p_") == "(`c` <= `_p_c`)"


def test_sql_for_missing_and_placeholder_positions() -> None:
    assert KO.sql_after(None) == "TRUE"  # no position: everything is still to read
    assert KO.sql_at_or_before(None) == "FALSE"  # NotStarted: nothing is visible
    assert KO.sql_after(KO.placeholder()) == "FALSE"  # finished empty vnode: nothing to read
    assert KO.sql_at_or_before(KO.placeholder()) == "TRUE"  # Completed: everything visible
    with pytest.raises(InvalidKeyValue):
        KO.sql_after((1, None, None, None, None))


def test_order_by_sql() -> None:
    assert KO.order_by_sql() == [
        "`i` ASC NULLS LAST", "`s` DESC NULLS FIRST", "`d` ASC NULLS LAST",
        "`m` DESC NULLS LAST", "`t` ASC NULLS LAST",
    ]
    assert one("int").order_by_sql("x") == ["x.`c` ASC NULLS LAST"]


# A tiny evaluator for the predicates we generate, following Spark's lexer rules for string
# literals (backslash escapes, '' for a quote): an independent check of what the SQL means.
_TOKEN = re.compile(
    r"\s*(?:(?P<ident>`(?:[^`]|``)*`)|(?P<str>'(?:[^'\\]|\\.|'')*')|(?P<num>-?\d+)"
    r"|(?P<op><=|>=|<|>|=)|(?P<word>[A-Za-z_]+)|(?P<punct>[(),]))"
)


def _unquote(lit: str) -> str:
    return re.sub(r"\\(.)|''", lambda m: m.group(1) or "'", lit[1:-1])


def evaluate(sql: str, row: dict) -> bool:
    toks, pos = [], 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        assert m and m.end() > pos, sql[pos:]
        toks.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    out, i = [], 0
    words = {"OR": "or", "AND": "and", "TRUE": "True", "FALSE": "False"}
    while i < len(toks):
        kind, text = toks[i]
        if text == "DATE":
            out.append(repr(dt.date.fromisoformat(_unquote(toks[i + 1][1]))))
            i += 2
            continue
        if text == "TIMESTAMP":
            ts = dt.datetime.strptime(_unquote(toks[i + 1][1]), "%Y-%m-%d %H:%M:%S.%f")
            out.append(repr(ts.replace(tzinfo=UTC)))
            i += 2
            continue
        if text == "CAST":  # CAST ( 'x' AS DECIMAL ( p , s ) )
            out.append(repr(Decimal(_unquote(toks[i + 2][1]))))
            i += 11
            continue
        if kind == "ident":
            out.append(f"row[{text[1:-1].replace('``', '`')!r}]")
        elif kind == "str":
            out.append(repr(_unquote(text)))
        elif kind == "op":
            out.append("==" if text == "=" else text)
        else:
            out.append(words.get(text, text))
        i += 1
    return eval(" ".join(out), {"datetime": dt, "Decimal": Decimal}, {"row": row})


VALUES = (
    st.one_of(st.integers(-2, 2), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.sampled_from(["", "'", "\\", "a'b", "\\'", "''", "é", "a\nb"]),
              st.text(st.characters(codec="utf-8"), max_size=3)),
    st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
    st.decimals(min_value=-9999, max_value=9999, places=2, allow_nan=False,
                allow_infinity=False),
    st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30),
                 timezones=st.sampled_from([None, UTC, PLUS5])),
)


@st.composite
def key_pairs(draw):
    pos = tuple(draw(v) for v in VALUES)
    key = tuple(p if draw(st.booleans()) else draw(v) for p, v in zip(pos, VALUES, strict=True))
    return KO.normalize(pos), KO.normalize(key)


@settings(max_examples=300, deadline=None)
@given(pair=key_pairs())
def test_sql_predicates_mean_what_compare_says(pair) -> None:
    pos, key = pair
    row = dict(zip(KO.names, key, strict=True))
    c = KO.compare(key, pos)
    assert evaluate(KO.sql_after(pos), row) == (c > 0)
    assert evaluate(KO.sql_at_or_before(pos), row) == (c <= 0)
    joined = {**row, **{f"_p_{n}": v for n, v in zip(KO.names, pos, strict=True)}}
    assert evaluate(KO.sql_after_columns("_p_"), joined) == (c > 0)
    assert evaluate(KO.sql_at_or_before_columns("_p_"), joined) == (c <= 0)
    assert evaluate(compute_bounds(pos).predicate(KO), row) == compute_bounds(pos).admits(KO, key)


def test_evaluator_reads_spark_string_escapes() -> None:
    assert _unquote("'a''b\\\\c\\''") == "a'b\\c'"
    assert evaluate("TRUE", {}) and not evaluate("FALSE", {})
