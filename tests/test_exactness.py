"""Exactness on every input: generated foreign upstreams, every supported type, hostile names.

The property: for any upstream schema (random column names from a hostile alphabet: spaces,
dots, mixed case, unicode; every supported type with nulls and extremes; partitioned or not),
written by another engine (plain deltalake) and changing between barriers, the MV equals the
independent oracle after every barrier, value for value and type for type, and the replica and
the progress table keep the upstream's exact types. Spark is slow, so few examples each.
"""

from __future__ import annotations

import random
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.types import arrow_type, type_name
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import CHANGE_FEED_COLUMNS, REPLICA_DELETED, REPLICA_VERSION, VNODE
from backfill_assets.mv.owned_tables import MVTables, open_if_exists
from backfill_assets.step.column_identity import used_columns
from backfill_assets.storage import arrow_schema
from tests.foreign import KEY_TYPES, VALUE_TYPES, ForeignTable, spark_quote
from tests.support import assert_verified

pytestmark = [pytest.mark.spark, pytest.mark.slow]
VNODES = 4
RESERVED = {"vnode", "backfill_finished", "row_count", "version", *CHANGE_FEED_COLUMNS}

names = st.text(alphabet="aZé日本 ._-1Q", min_size=1, max_size=6).filter(
    lambda n: n[0] not in " .-1" and n.lower() not in RESERVED)


@st.composite
def upstreams(draw) -> dict:
    """A foreign upstream and an MV over it."""
    key_types = draw(st.lists(st.sampled_from(KEY_TYPES), min_size=1, max_size=2))
    value_types = draw(st.lists(st.sampled_from(VALUE_TYPES), min_size=1, max_size=5))
    partitioned = draw(st.booleans())
    count = len(key_types) + len(value_types) + int(partitioned)
    picked = draw(st.lists(names, min_size=count, max_size=count,
                           unique_by=lambda n: n.lower()))
    keys, rest = picked[:len(key_types)], picked[len(key_types):]
    columns = dict(zip(keys, key_types, strict=True))
    columns.update(zip(rest, [*value_types, "string"], strict=False))
    values = [n for n in columns if n not in keys]
    selected = keys + [n for n in values if draw(st.booleans())]
    probe = draw(st.sampled_from(values))
    raw = {"name": "exact_mv", "primary_key": keys, "columns": selected, "chunk_size": 5,
           "vnode_count": VNODES, "mode": draw(st.sampled_from(["arrangement", "snapshot"])),
           "computed": [{"name": draw(names.filter(lambda n: n.lower() not in
                                                   {c.lower() for c in columns})),
                         "expr": f"{spark_quote(probe)} IS NULL"}]}
    if draw(st.booleans()):
        raw["filter"] = f"{spark_quote(probe)} IS NOT NULL OR {spark_quote(keys[0])} IS NULL"
    return {"columns": columns, "key": tuple(keys),
            "partition_by": rest[-1] if partitioned else None, "raw": raw,
            "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=upstreams())
def test_generated_foreign_upstreams_are_exact(spark, case):
    warehouse = tempfile.mkdtemp(prefix="exact-")
    uri = f"{warehouse}/upstream"
    table = ForeignTable(uri, case["columns"], case["key"], case["partition_by"],
                         random.Random(case["seed"]))
    if table.partition_by:
        table.columns[table.partition_by] = "string"
    table.create(24)
    d = MVDefinition.from_dict({**case["raw"], "upstream": uri})
    tables = MVTables.under(warehouse, d.name, uri)
    for barrier in range(4):
        table.churn(updates=3, inserts=2, deletes=2)
        ranges = [[0, 1], [2, 3]] if barrier % 2 else [list(range(VNODES))]
        for vnodes in ranges:
            run_barrier(spark, d, tables, vnodes)
        assert_verified(spark, d, tables)
    _assert_exact_types(tables, table.schema, d, d.mode == "arrangement")


def _assert_exact_types(tables: MVTables, upstream: pa.Schema, d: MVDefinition,
                        with_replica: bool) -> None:
    """The replica (arrangement mode keeps one) holds the upstream columns the MV reads, each
    with its exact type, and no other (the backfill carries only those); the progress table
    holds the pk with its exact type (the MV's types are checked by the oracle)."""
    if with_replica:
        replica = arrow_schema(open_if_exists(tables.replica, {}))
        read = used_columns(d, upstream.names)
        data = {f.name for f in replica} - {VNODE, REPLICA_VERSION, REPLICA_DELETED}
        assert data == read, (replica.names, read)
        for f in upstream:
            if f.name in read:
                assert replica.field(f.name).type == f.type, \
                    (f.name, replica.field(f.name).type, f.type)
    progress = arrow_schema(open_if_exists(tables.progress, {}))
    for k in (c.name for c in d.primary_key):
        assert progress.field(k).type == upstream.field(k).type, k


@pytest.mark.parametrize("name", ["int", "bigint", "smallint", "tinyint", "string", "binary",
                                  "date", "timestamp", "timestamp_ntz", "float", "double",
                                  "boolean", "null", "decimal(38,10)", "decimal(5,2)"])
def test_type_names_are_exact_both_ways(name):
    assert type_name(arrow_type(name)) == name


def test_unsupported_upstream_type_is_refused_by_name(spark, warehouse):
    """A column the platform cannot carry (here a list) that the MV selects is named, before
    anything is written."""
    from deltalake import write_deltalake

    from backfill_assets.core.errors import UnsupportedColumnType

    uri = f"{warehouse}/listy"
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string()))])
    write_deltalake(uri, pa.Table.from_pylist([{"id": 1, "tags": ["a"]}], schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    d = MVDefinition.from_dict({"name": "listy_mv", "upstream": uri, "primary_key": ["id"],
                                "columns": ["id", "tags"], "vnode_count": VNODES})
    tables = MVTables.under(warehouse, d.name, uri)
    with pytest.raises(UnsupportedColumnType, match=r"'tags'.*list"):
        run_barrier(spark, d, tables, list(range(VNODES)))
    assert open_if_exists(tables.mv, {}) is None and open_if_exists(tables.progress, {}) is None
