"""A dimension is checked when its Delta table is read, before anything is written: a table
created the platform's way (change feed on, key recorded) serves a join; one a plain delta-rs
writer made without a change feed is refused by name (DimensionWithoutChangeFeed), and one
whose recorded key is not the declared key is refused too. Real Delta tables (delta-rs)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from backfill_assets import storage
from backfill_assets.arrow.types import type_name
from backfill_assets.core.errors import DimensionWithoutChangeFeed, InvalidJoin
from backfill_assets.core.join_definition import Dimension, check_dimension, parse_joins
from backfill_assets.upstream.writer import UpstreamSpec, create_upstream

ORDERS = {"id": "bigint", "customer": "int", "amount": "decimal(10,2)"}
(JOIN,) = parse_joins([{"table": "customers", "key": ["cid"], "on": {"customer": "cid"},
                        "columns": ["region"], "kind": "left"}])


def dimension_of(uri: str) -> Dimension:
    """What a step reads of a dimension table before its first write."""
    table = storage.open_table(uri)
    config = table.metadata().configuration
    columns = {f.name: type_name(f.type) for f in storage.arrow_schema(table)}
    key = json.loads(config[storage.PK_PROPERTY]) if storage.PK_PROPERTY in config else None
    return Dimension(table.metadata().name or uri, columns,
                     config.get("delta.enableChangeDataFeed") == "true",
                     tuple(key) if key else None)


def test_a_platform_dimension_serves_and_a_plain_one_is_refused(tmp_path) -> None:
    good = str(tmp_path / "customers")
    create_upstream(good, UpstreamSpec("customers", {"cid": "int", "region": "string"},
                                       ("cid",)))
    assert check_dimension(JOIN, dimension_of(good), ORDERS) == {"region": "string"}

    plain = str(tmp_path / "plain")
    write_deltalake(plain, pa.table({"cid": pa.array([1], pa.int32()), "region": ["n"]}))
    with pytest.raises(DimensionWithoutChangeFeed, match="no change data feed"):
        check_dimension(JOIN, dimension_of(plain), ORDERS)

    other_key = str(tmp_path / "by_region")
    create_upstream(other_key, UpstreamSpec("by_region", {"cid": "int", "region": "string"},
                                            ("region",)))
    with pytest.raises(InvalidJoin, match=r"table's key is \['region'\]"):
        check_dimension(JOIN, dimension_of(other_key), ORDERS)
