"""An MV's joins: parsed, recorded in the fingerprint, and every refusal the issue names made
by name before anything is written (the definition alone, then the dimension once read)."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from backfill_assets.core.errors import (
    ChangeFeedDisabled,
    DimensionWithoutChangeFeed,
    InvalidJoin,
    InvalidMVDefinition,
)
from backfill_assets.core.join_definition import (
    Dimension,
    JoinedColumn,
    check_dimension,
    join_sql,
)
from backfill_assets.core.mv_definition import MVDefinition

ORDERS = {"id": "bigint", "customer": "int", "amount": "decimal(10,2)", "vnode": "int"}
CUSTOMERS = {"cid": "int", "region": "string", "tier": "int", "vnode": "int"}
JOIN = {"table": "customers", "key": ["cid"], "on": {"customer": "cid"},
        "columns": ["region", {"name": "customer_tier", "column": "tier"}], "kind": "left"}
ROW_MV = {"name": "mv", "upstream": "orders", "primary_key": ["id"],
          "columns": ["id", "amount", "region"], "joins": [JOIN]}


def make(join: dict | None = None, **over) -> MVDefinition:
    return MVDefinition.from_dict({**ROW_MV, "joins": [{**JOIN, **(join or {})}], **over})


def test_joined_columns_read_like_upstream_columns_in_every_part_of_a_definition() -> None:
    d = make(filter="region <> 'void'", computed=[{"name": "t2", "expr": "customer_tier*2"}])
    (j,) = d.joins
    assert (j.table, j.key, j.on, j.kind) == ("customers", ("cid",), (("customer", "cid"),),
                                              "left")
    assert j.columns == (JoinedColumn("region", "region"), JoinedColumn("customer_tier", "tier"))
    assert d.validate(ORDERS).output_columns == ("id", "amount", "region", "t2", "vnode")
    agg = MVDefinition.from_dict({**ROW_MV, "columns": [], "group_by": ["region"],
                                  "aggregates": {"n": "count(*)", "tiers": "max(customer_tier)"}})
    agg.validate(ORDERS, joined={"region": "string", "customer_tier": "int"})
    with pytest.raises(InvalidMVDefinition, match="sum and avg are kept exact over numbers"):
        MVDefinition.from_dict({**ROW_MV, "columns": [], "group_by": ["customer_tier"],
                                "aggregates": {"s": "sum(region)"}}).validate(
            ORDERS, joined={"region": "string", "customer_tier": "int"})


def test_the_fingerprint_covers_joins_and_a_definition_without_joins_keeps_its_own() -> None:
    plain = MVDefinition.from_dict({k: v for k, v in ROW_MV.items() if k != "joins"})
    assert "joins" not in plain.recorded()
    assert plain.fingerprint == MVDefinition.from_dict({**ROW_MV, "joins": []}).fingerprint
    pinned = {"name": "mv", "upstream": "orders", "primary_key": ["id"], "filter": "amount > 0",
              "columns": ["id", "amount", "region"],
              "computed": [{"name": "x", "expr": "amount * 2"}]}
    assert MVDefinition.from_dict(pinned).fingerprint == "712cbd6b06bdedf0"  # as before joins
    left, inner = make(), make({"kind": "inner"})
    assert len({plain.fingerprint, left.fingerprint, inner.fingerprint}) == 3
    assert make({"columns": ["region"]}).fingerprint != left.fingerprint
    assert inner.changes_since(left.recorded()) and not left.changes_since(left.recorded())
    assert make().joins[0].kind == "left" and make({"kind": "INNER"}).joins[0].kind == "inner"
    no_kind = {k: v for k, v in JOIN.items() if k != "kind"}
    assert MVDefinition.from_dict({**ROW_MV, "joins": [no_kind]}).joins[0].kind == "inner"


@pytest.mark.parametrize(("join", "over", "match"), [
    ({"on": {"customer": "region"}}, {}, "not the dimension's declared key"),
    ({"key": ["cid", "region"]}, {}, "not the dimension's declared key"),
    ({"on": {"nope": "cid"}}, {}, r"unknown upstream columns \['nope'\]"),
    ({"kind": "full"}, {}, "kind 'full'.*inner.*left"),
    ({"columns": ["amount"]}, {}, "'amount'.*clashes with a column of the upstream"),
    ({"columns": [{"name": "Vnode", "column": "tier"}]}, {}, "clashes.*vnode"),
    ({"columns": [{"name": "__bf_x", "column": "tier"}]}, {}, "prefix"),
    ({"table": "orders"}, {}, "with itself"),
    ({}, {"primary_key": ["region"]}, "names joined columns"),
    ({}, {"columns": ["id", "tier"]}, r"unknown columns \['tier'\]"),
    ({}, {"computed": [{"name": "region", "expr": "1"}]}, "computed column 'region'"),
])
def test_a_wrong_join_is_refused_by_name_saying_what_to_do(join, over, match) -> None:
    with pytest.raises(InvalidMVDefinition, match=match):
        make(join, **over).validate(ORDERS)


def test_a_catalog_refuses_what_it_can_see_without_the_upstream_when_it_loads() -> None:
    for join, match in (({"kind": "cross"}, "kind 'cross'"),
                        ({"on": {"customer": "region"}}, "not the dimension's declared key"),
                        ({"table": "orders"}, "with itself")):
        with pytest.raises(InvalidJoin, match=match):
            make(join).check_controls()
    assert make({"on": {"nope": "cid"}}).check_controls().joins  # needs the upstream: later


def test_two_joins_may_not_bring_the_same_name() -> None:
    second = {**JOIN, "table": "regions", "columns": ["region"]}
    d = MVDefinition.from_dict({**ROW_MV, "joins": [JOIN, second]})
    with pytest.raises(InvalidJoin, match="'region' of 'regions' clashes.*join of 'customers'"):
        d.validate(ORDERS)


@pytest.mark.parametrize("item", [
    "customers", [{"table": "c"}], [{**JOIN, "how": "left"}], [{**JOIN, "on": ["cid"]}],
    [{**JOIN, "columns": [{"name": "x"}]}], [{**JOIN, "on": {"customer": 5}}],
    [{**JOIN, "key": ["cid", None]}],
])
def test_a_malformed_join_item_is_refused_when_parsed(item) -> None:
    with pytest.raises(InvalidJoin):
        MVDefinition.from_dict({**ROW_MV, "joins": item})


def test_the_definition_of_docs_joins_md_loads_from_yaml_where_on_reads_as_true() -> None:
    text = (pathlib.Path(__file__).parents[2] / "docs" / "JOINS.md").read_text()
    raw = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S)[1])
    assert True in raw["joins"][0]  # YAML 1.1: the key `on` is the boolean true
    d = MVDefinition.from_dict(raw).validate(ORDERS, joined={"region": "string",
                                                             "customer_tier": "int"})
    assert d.joins[0].on == (("customer", "cid"),)
    assert d.output_columns == ("region", "revenue", "orders", "vnode")


def test_the_dimension_is_checked_when_read() -> None:
    (j,) = make().joins
    typed = check_dimension(j, Dimension("customers", CUSTOMERS, True, ("cid",)), ORDERS)
    assert typed == {"region": "string", "customer_tier": "int"}
    with pytest.raises(DimensionWithoutChangeFeed, match="enableChangeDataFeed") as e:
        check_dimension(j, Dimension("customers", CUSTOMERS, False), ORDERS)
    assert isinstance(e.value, ChangeFeedDisabled)
    cases = [(Dimension("customers", {"cid": "int"}, True), r"no columns \['region', 'tier'\]"),
             (Dimension("customers", CUSTOMERS, True, ("region",)), "table's key is"),
             (Dimension("customers", {**CUSTOMERS, "cid": "bigint"}, True),
              "'customer' is int but key column 'cid' is bigint"),
             (Dimension("customers", {**CUSTOMERS, "cid": "double"}, True), "double")]
    for dim, match in cases:
        with pytest.raises(InvalidJoin, match=match):
            check_dimension(j, dim, ORDERS)


def test_join_sql_is_the_join_the_mv_equals_for_the_oracle() -> None:
    d = make({"columns": ["region", {"name": "odd`name", "column": "tier"}]})
    sql = join_sql(d.joins, "orders_v3", {"customers": "customers_v7"}, ["id", "amount"])
    assert sql == ("SELECT f.`id`, f.`amount`, d0.`region` AS `region`, d0.`tier` AS "
                   "`odd``name` FROM orders_v3 f LEFT JOIN customers_v7 d0 ON "
                   "f.`customer` = d0.`cid`")
    inner = join_sql(make({"kind": "inner"}).joins, "o", {"customers": "c"}, ["id"])
    assert " JOIN c d0 ON " in inner and "LEFT" not in inner


def test_tables_read_names_the_upstream_then_each_dimension_once() -> None:
    """What lineage draws as the MV's upstream assets and what a sensor watches: a barrier
    is due when any of these tables moved."""
    from backfill_assets.core.join_definition import tables_read
    from backfill_assets.core.mv_definition import MVDefinition

    raw = {"name": "m", "upstream": "orders", "primary_key": ["id"], "columns": ["id"],
           "joins": [{"table": "customers", "key": ["cid"], "on": {"cid": "cid"},
                      "columns": ["region"]},
                     {"table": "products", "key": ["pid"], "on": {"pid": "pid"},
                      "columns": ["label"]}]}
    assert tables_read(MVDefinition.from_dict(raw)) == ("orders", "customers", "products")
    del raw["joins"]
    assert tables_read(MVDefinition.from_dict(raw)) == ("orders",)


def test_the_demo_join_definition_loads() -> None:
    """jobs/configs/mvs/revenue_by_segment.yaml: an aggregate over orders LEFT JOIN customers."""
    import yaml

    from backfill_assets.core.mv_definition import MVDefinition

    with open("jobs/configs/mvs/revenue_by_segment.yaml") as f:
        d = MVDefinition.from_dict(yaml.safe_load(f))
    assert d.is_aggregate and [j.table for j in d.joins] == ["customers"]
    assert d.joins[0].kind == "left" and d.joins[0].on == (("name", "customer"),)
