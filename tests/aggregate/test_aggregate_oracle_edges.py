"""Edges the generated aggregate histories found, pinned without Spark: the oracle holds
-0.0 and 0.0 as one value (Spark's max over a group holding both keeps whichever its scan
meets first, so a correct MV must not fail verify_job on the sign of a zero), and a group_by
name that is not a plain identifier is refused saying to quote it, and accepted quoted."""

from __future__ import annotations

import pyarrow as pa
import pytest

from backfill_assets.core.aggregate_definition import parse_group_by
from backfill_assets.core.errors import InvalidAggregate
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
