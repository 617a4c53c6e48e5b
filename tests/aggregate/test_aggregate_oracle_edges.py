"""Edges the generated aggregate histories found, pinned without Spark: the oracle holds
-0.0 and 0.0 as one value (Spark's max over a group holding both keeps whichever its scan
meets first, so a correct MV must not fail verify_job on the sign of a zero), and a group_by
name that is not a plain identifier is refused saying to quote it, and accepted quoted."""

from __future__ import annotations

import pyarrow as pa
import pytest

from backfill_assets.core.aggregate_definition import parse_group_by
from backfill_assets.core.errors import InvalidAggregate, InvalidMVDefinition
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.verify.aggregate_oracle import _by_vnode


def test_the_oracle_holds_the_two_zeros_equal():
    d = MVDefinition.from_dict({"name": "z", "upstream": "u", "primary_key": ["id"],
                                "group_by": ["g"], "aggregates": {"top": "max(r)"},
                                "vnode_count": 4})
    outputs = ["g", "top"]
    spark_side = pa.table({"g": pa.array([1], pa.int32()), "top": pa.array([-0.0])})
    mv_side = pa.table({"g": pa.array([1], pa.int32()), "top": pa.array([0.0])})
    expected = _by_vnode(spark_side, d, outputs, set(), with_vnode=True)
    vnode = next(iter(expected))
    mv_side = mv_side.append_column("vnode", pa.array([vnode], pa.int32()))
    assert _by_vnode(mv_side, d, outputs, set(), with_vnode=False) == expected


def test_a_spaced_group_by_name_is_refused_saying_to_quote_it():
    with pytest.raises(InvalidAggregate, match="in backquotes"):
        parse_group_by(["ré gion"])
    (column,) = parse_group_by(["`ré gion`"])
    assert column.name == "ré gion"


def test_an_aggregate_over_an_aggregate_mv_keeping_input_is_refused_by_name():
    """An aggregate over another aggregate MV, keyed by its group_key: max() keeps input
    keyed by (group_key, upstream pk), two columns of one name. Before, the barrier wrote the
    state table and then failed creating the kept input with a Delta schema error."""
    upstream = {"group_key": "string", "region": "string", "orders": "bigint", "vnode": "int"}
    raw = {"name": "sizes", "upstream": "by_region", "primary_key": ["group_key"],
           "group_by": [{"name": "big", "expr": "CAST(orders > 20 AS INT)"}], "vnode_count": 2}
    exact = MVDefinition.from_dict({**raw, "aggregates": {"n": "count(*)", "o": "sum(orders)"}})
    exact.validate(upstream)
    kept = MVDefinition.from_dict({**raw, "aggregates": {"top": "max(orders)"}})
    with pytest.raises(InvalidMVDefinition, match="key this MV by the upstream's group columns"):
        kept.validate(upstream)
