"""An aggregate MV's definition: group_by and aggregates parsed, typed as Spark types them,
recorded in the fingerprint, and every mistake refused by name before anything is written."""

from __future__ import annotations

import pytest

from backfill_assets.core.aggregate_definition import (
    Aggregate,
    GroupColumn,
    check_input_types,
    parse_aggregates,
    result_type,
)
from backfill_assets.core.errors import InvalidAggregate, InvalidMVDefinition
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.sql_calls import calls

UPSTREAM = {"id": "bigint", "region": "string", "ts": "timestamp", "amount": "decimal(10,2)",
            "qty": "int", "price": "double", "note": "string", "flag": "boolean"}
BASE = {"name": "revenue", "upstream": "orders", "primary_key": ["id"],
        "group_by": ["region", {"name": "day", "expr": "to_date(ts)"}],
        "aggregates": {"revenue": "sum(amount)", "orders": "count(*)", "avg_qty": "avg(qty)",
                       "top": "MAX(price)", "buyers": "count(DISTINCT note)"}}


def make(**over) -> MVDefinition:
    return MVDefinition.from_dict({**BASE, **over})


def test_parses_group_by_and_aggregates_and_names_the_outputs() -> None:
    d = make()
    assert d.is_aggregate and d.columns == ()
    assert d.group_by == (GroupColumn("region", "region"), GroupColumn("day", "to_date(ts)"))
    assert d.aggregates == (
        Aggregate("revenue", "sum", "amount"), Aggregate("orders", "count", None),
        Aggregate("avg_qty", "avg", "qty"), Aggregate("top", "max", "price"),
        Aggregate("buyers", "count", "note", True))
    assert d.output_columns == ("region", "day", "revenue", "orders", "avg_qty", "top", "buyers",
                                "vnode")
    assert d.validate(UPSTREAM).primary_key[0].type == "bigint"


def test_the_fingerprint_covers_the_aggregate_and_a_row_mv_keeps_its_own() -> None:
    row = MVDefinition.from_dict({"name": "m", "upstream": "orders", "primary_key": ["id"],
                                  "columns": ["id"]})
    assert "group_by" not in row.recorded()  # existing MVs' fingerprints do not move
    assert make().recorded()["aggregates"][0] == ["revenue", "sum(amount)"]
    assert make().fingerprint != make(aggregates={"revenue": "sum(qty)"}).fingerprint
    assert make().fingerprint != make(group_by=["region"]).fingerprint
    assert make().changes_since(make(group_by=["region"]).recorded()) == [
        "group_by changed from [['region', 'region']] to "
        "[['region', 'region'], ['day', 'to_date(ts)']]"]


@pytest.mark.parametrize(("over", "message"), [
    ({"aggregates": {"x": "stddev(amount)"}}, r"calls stddev\(\), which is not supported"),
    ({"aggregates": {"x": "sum(amount) + 1"}}, "write one call of count"),
    ({"aggregates": {"x": "sum(*)"}}, "only count takes"),
    ({"aggregates": {"x": "sum(DISTINCT amount)"}}, "DISTINCT is supported in count only"),
    ({"aggregates": {"x": "max(amount, qty)"}}, "exactly one argument"),
    ({"aggregates": {}}, "aggregates is empty"),
    ({"group_by": ["to_date(ts)"]}, "an expression needs a name"),
    ({"group_by": []}, "group_by must be a non-empty list"),
])
def test_malformed_aggregates_are_refused_while_parsing(over, message) -> None:
    with pytest.raises(InvalidAggregate, match=message):
        make(**over)


@pytest.mark.parametrize(("over", "message"), [
    ({"aggregates": {"x": "sum(amount * rand())"}}, r"calls \['rand'\].*function of the upstream"),
    ({"group_by": [{"name": "t", "expr": "current_timestamp"}]}, r"\['current_timestamp'\]"),
    ({"filter": "ts > now()"}, r"filter .*\['now'\]"),
    ({"computed": [{"name": "u", "expr": "uuid()"}]}, r"computed column 'u'.*\['uuid'\]"),
    ({"aggregates": {"x": "sum(max(qty))"}}, r"uses \['max'\], aggregate or window"),
    ({"group_by": [{"name": "r", "expr": "row_number() OVER (ORDER BY id)"}]}, "window"),
    ({"aggregates": {"x": "sum(note)"}}, "over string: sum and avg are kept exact over numbers"),
    ({"aggregates": {"x": "avg(flag)"}}, "over boolean"),
    ({"aggregates": {"x": "count(DISTINCT price)"}}, "normalizes -0.0 and NaN"),
    ({"group_by": ["price"]}, "cannot key the MV"),
    ({"group_by": ["nope"]}, "unknown column 'nope'"),
    ({"aggregates": {"x": "min(nope)"}}, "reads unknown column 'nope'"),
    ({"aggregates": {"region": "count(*)"}}, r"names \['region'\] appear more than once"),
    ({"aggregates": {"vnode": "count(*)"}}, "appear more than once"),
    ({"aggregates": {"__bf_n": "count(*)"}}, "reserves for its own helper columns"),
    ({"columns": ["id"]}, "remove columns"),
    ({"group_by": ["region"], "aggregates": {"_change_type": "count(*)"}}, "change data feed"),
])
def test_definitions_that_cannot_be_kept_exact_are_refused_by_name(over, message) -> None:
    with pytest.raises(InvalidMVDefinition, match=message):
        make(**over).validate(UPSTREAM)


def test_text_inside_literals_and_backticks_is_not_a_call() -> None:
    text = "concat('rand()', `now`, \"uuid()\") -- rand()\n + x.rand(1)"
    assert [c.name for c in calls(text)] == ["concat"]
    make(group_by=[{"name": "k", "expr": "concat(region, 'rand()')"}]).validate(UPSTREAM)
    assert [c.no_arguments for c in calls("unix_timestamp() + unix_timestamp(ts)")] == [True,
                                                                                        False]


@pytest.mark.parametrize(("call", "input_type", "want"), [
    ("sum(x)", "tinyint", "bigint"), ("sum(x)", "int", "bigint"), ("sum(x)", "float", "double"),
    ("sum(x)", "decimal(10,2)", "decimal(20,2)"), ("sum(x)", "decimal(30,5)", "decimal(38,5)"),
    ("avg(x)", "bigint", "double"), ("avg(x)", "decimal(10,2)", "decimal(14,6)"),
    ("avg(x)", "decimal(38,36)", "decimal(38,38)"), ("min(x)", "date", "date"),
    ("max(x)", "DECIMAL(5, 1)", "decimal(5,1)"), ("count(x)", "string", "bigint"),
    ("count(DISTINCT x)", "date", "bigint"), ("count(*)", "", "bigint"),
])
def test_result_types_follow_spark(call, input_type, want) -> None:
    (agg,) = parse_aggregates({"x": call})
    assert result_type(agg, input_type) == want


def test_expression_types_are_checked_once_spark_has_analysed_them() -> None:
    group_by = (GroupColumn("day", "to_date(ts)"),)
    aggs = parse_aggregates({"t": "sum(qty * price)", "n": "count(*)"})
    assert check_input_types(group_by, aggs, {"day": "date", "t": "double"}) == {
        "day": "date", "t": "double", "n": "bigint"}
    with pytest.raises(InvalidAggregate, match="over string"):
        check_input_types(group_by, aggs, {"day": "date", "t": "string"})
    with pytest.raises(InvalidAggregate, match=r"no type for \['t'\]"):
        check_input_types(group_by, aggs, {"day": "date"})


def test_an_output_named_like_the_mv_key_column_is_refused() -> None:
    """The MV's own key column is `group_key` (the group key as text): no output takes it."""
    d = make(aggregates={"GROUP_KEY": "count(*)"})
    with pytest.raises(InvalidMVDefinition, match="group_key"):
        d.validate(UPSTREAM)
