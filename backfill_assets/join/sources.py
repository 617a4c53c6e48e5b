"""The two sides of a join barrier as it reads them: each dimension found and checked before
anything is written, and either side's change range as signed rows netted per key.

Why a dimension is found beside the MV's folder: a join names its dimension like an MV names
its upstream (a table of the warehouse, or another MV, whose rows are its `downstream_mv`),
so both resolve against the warehouse that holds the MV (`dimension_uri`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession

from backfill_assets import storage
from backfill_assets.arrow import netting
from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.arrow.types import type_name
from backfill_assets.core.errors import UpstreamNotFound
from backfill_assets.core.join_definition import Dimension, Join, check_dimension
from backfill_assets.core.names import VNODE
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.key_checks import check_change_keys


@dataclass(frozen=True)
class Side:
    """One dimension as a barrier reads it: where, its columns' types, its latest version."""

    join: Join
    uri: str
    types: dict[str, str]
    version: int


def dimension_uri(tables: MVTables, name: str) -> str:
    """A dimension named like an upstream: a URI or path as it is; another MV's name, its
    `downstream_mv`; else the table of that name in the MV's warehouse."""
    if "://" in name or name.startswith("/"):
        return name
    warehouse = tables.root.rsplit("/", 1)[0]
    as_mv = f"{warehouse}/{name}/downstream_mv"
    local = as_mv.removeprefix("file://")
    return as_mv if "://" not in local and os.path.isdir(local) else f"{warehouse}/{name}"


def checked_sides(tables: MVTables, joins: Sequence[Join], fact: Mapping[str, str]
                  ) -> tuple[list[Side], dict[str, str]]:
    """Every dimension opened at its latest version and checked against its join
    (`check_dimension`: change feed, columns, declared key, key types), before any write;
    and the joined columns' types."""
    sides, joined = [], {}
    for j in joins:
        uri = dimension_uri(tables, j.table)
        table = owned_tables.open_if_exists(uri, tables.storage_options)
        if table is None:
            raise UpstreamNotFound(
                f"dimension {j.table!r} ({uri}) does not exist; create it (a platform "
                "upstream, with its key and change data feed) or fix `table` in the join")
        config = table.metadata().configuration
        types = {f.name: _lenient(f) for f in storage.arrow_schema(table) if f.name != VNODE}
        key = config.get(storage.PK_PROPERTY)
        dim = Dimension(j.table, types, config.get("delta.enableChangeDataFeed") == "true",
                        tuple(json.loads(key)) if key else None)
        joined |= check_dimension(j, dim, fact)
        sides.append(Side(j, uri, types, table.version()))
    return sides, joined


def _lenient(field: pa.Field) -> str:
    try:
        return type_name(field.type)
    except Exception:  # noqa: BLE001 - a column the join does not read may be any type
        return str(field.type)


def signed_changes(uri: str, start_exclusive: int, end: int, schema: pa.Schema,
                   key: Sequence[str], storage_options: Mapping[str, str], *,
                   fact: bool) -> pa.Table:
    """The range's changes netted per ``key`` (the row before the range, the row after) as
    signed rows of ``schema``: `SIGN` -1 / +1, then the columns. A fact's keys are checked like any
    upstream's (no null pk, no key inserted twice by one version); a dimension row with a
    null key is matched by nothing, so it passes through and is dropped by the join state."""
    columns = schema.names[1:]
    if end <= start_exclusive:
        return schema.empty_table()
    raw = storage.read_raw_changes(uri, start_exclusive, end, list(columns),
                                   storage_options=storage_options)
    raw = raw.select([*columns, "_change_type", "_commit_version"])
    if fact:
        check_change_keys(raw, list(key), uri)
    netted = netting.net_with_prior(raw, list(key), checked=fact)  # facts: keys checked above
    return pa.concat_tables([_signed(netted.before.select(columns), -1).cast(schema),
                             _signed(netted.after.select(columns), 1).cast(schema)])


def rows_at(spark: SparkSession, uri: str, version: int, schema: pa.Schema,
            storage_options: Mapping[str, str]) -> pa.Table:
    """Every row of the table at ``version`` as +1 signed rows of ``schema`` (`SIGN`, then
    the columns): a bulk build is the barrier from empty state (docs/JOINS.md)."""
    columns = schema.names[1:]
    snap = storage.TableVersion.load(uri, version, storage_options)
    read = pa.schema([snap.arrow_schema.field(c) for c in columns])
    rows = storage.read_version(spark, uri, version, read,
                                storage_options=storage_options).toArrow()
    return _signed(rows.select(columns), 1).cast(schema)


def _signed(rows: pa.Table, sign: int) -> pa.Table:
    return rows.add_column(0, SIGN, pa.repeat(pa.scalar(sign, pa.int8()), rows.num_rows))
