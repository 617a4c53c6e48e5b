"""The upstream table's spec: what its columns, primary key and vnodes are, and where it is kept.

An upstream table is a Delta table with
- a declared primary key (one or more columns of type int, bigint, string, date, timestamp or
  decimal(p,s)), recorded in the table configuration (``backfill.primaryKey``) together with the
  vnode count (``backfill.vnodeCount``), so any reader recovers the spec with
  :func:`read_upstream_spec`;
- an int ``vnode`` partition column computed by the stable hash of the key
  (backfill_assets/core/vnode.py);
- the change data feed on.

Values are checked against a spec in upstream/values.py, DML batches written in
upstream/writer/dml.py; backfill_assets/upstream/writer/__init__.py re-exports all three for
callers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.arrow.types import arrow_type, type_name
from backfill_assets.core.errors import (
    BackfillError,
    InvalidKeyType,
    InvalidUpstreamSpec,
    NotAnUpstreamTable,
)
from backfill_assets.core.key_types import decimal_precision_scale
from backfill_assets.core.keys import KeyColumn
from backfill_assets.core.names import VNODE
from backfill_assets.core.vnode import (
    DEFAULT_VNODE_COUNT,
    MAX_VNODE_COUNT,
    normalize_key_type,
    vnode_of,
)

PK_PROPERTY = storage.PK_PROPERTY
VNODE_COUNT_PROPERTY = storage.VNODE_COUNT_PROPERTY
COLUMN_TYPES = ("int", "bigint", "string", "date", "timestamp", "decimal(p,s)", "double",
                "boolean")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class UpstreamSpec:
    """What an upstream table is: its columns (name -> type, in order), primary key, vnodes."""

    name: str
    columns: Mapping[str, str]
    primary_key: tuple[str, ...]
    vnode_count: int = DEFAULT_VNODE_COUNT
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        cols = {}
        for name, typ in dict(self.columns).items():
            if not isinstance(name, str) or not _NAME_RE.match(name) or name == VNODE:
                raise InvalidUpstreamSpec(
                    f"column name {name!r} is not allowed: use lower-case letters, digits and _ "
                    f"starting with a letter; {VNODE!r} is the platform's partition column"
                )
            try:
                arrow_type(typ.strip().lower())
            except BackfillError:
                raise InvalidUpstreamSpec(
                    f"column {name!r} has type {typ!r}; use one of {', '.join(COLUMN_TYPES)}"
                ) from None
            cols[name] = _spell_type(typ)
        object.__setattr__(self, "columns", cols)
        if not self.primary_key:
            raise InvalidUpstreamSpec(
                f"table {self.name!r} needs a primary key (one or more columns)"
            )
        if len(set(self.primary_key)) != len(self.primary_key):
            raise InvalidUpstreamSpec(f"primary key {self.primary_key} repeats a column")
        for k in self.primary_key:
            if k not in cols:
                raise InvalidUpstreamSpec(
                    f"primary-key column {k!r} is not a column of {self.name!r} "
                    f"(columns: {', '.join(cols)})"
                )
            try:
                normalize_key_type(cols[k])
            except BackfillError:
                raise InvalidUpstreamSpec(
                    f"primary-key column {k!r} has type {cols[k]}; a key column must be int, "
                    "bigint, string, date, timestamp or decimal(p,s)"
                ) from None
        if isinstance(self.vnode_count, bool) or not 1 <= int(self.vnode_count) <= MAX_VNODE_COUNT:
            raise InvalidUpstreamSpec(
                f"vnode count must be 1..{MAX_VNODE_COUNT}, got {self.vnode_count}"
            )

    @property
    def key_types(self) -> tuple[str, ...]:
        return tuple(self.columns[k] for k in self.primary_key)

    @property
    def key_columns(self) -> tuple[KeyColumn, ...]:
        return tuple(KeyColumn(k, self.columns[k]) for k in self.primary_key)

    @property
    def value_columns(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c not in self.primary_key)

    def arrow_schema(self) -> pa.Schema:
        """Table schema: the columns in order (pk non-null), then ``vnode`` (int, non-null)."""
        fields = [pa.field(n, arrow_type(t), nullable=n not in self.primary_key)
                  for n, t in self.columns.items()]
        fields.append(pa.field(VNODE, pa.int32(), nullable=False))
        return pa.schema(fields)

    def vnode_of(self, key: tuple) -> int:
        return vnode_of(tuple(key), self.key_types, self.vnode_count)


def _spell_type(typ: str) -> str:
    t = typ.strip().lower()
    try:
        precision, scale = decimal_precision_scale(t)
    except InvalidKeyType:
        return t
    return f"decimal({precision},{scale})"


# --------------------------------------------------------------------------------- create / read


def create_upstream(uri: str, spec: UpstreamSpec, storage_options=None) -> int:
    """Create the (empty) upstream table; returns its version (0)."""
    metadata = storage.arrangement_properties(spec.primary_key, spec.vnode_count)
    dt_ = storage.create_table(
        uri, spec.arrow_schema(), [VNODE], cdf=True, name=spec.name,
        description=spec.description or f"platform upstream table {spec.name}",
        metadata=metadata, storage_options=storage_options,
    )
    return dt_.version()


def read_upstream_spec(uri: str, storage_options=None) -> UpstreamSpec:
    """Recover the spec recorded by :func:`create_upstream` (column types from the schema)."""
    table = storage.open_table(uri, storage_options=storage_options)
    meta = table.metadata()
    config = meta.configuration
    if PK_PROPERTY not in config:
        raise NotAnUpstreamTable(
            f"{uri} has no recorded primary key ({PK_PROPERTY}): create it with create_upstream "
            "(or upstream_load_job), or declare the key where the backfill is configured"
        )
    schema = storage.arrow_schema(table)
    columns = {f.name: type_name(f.type) for f in schema if f.name != VNODE}
    return UpstreamSpec(
        name=meta.name or uri.rstrip("/").rsplit("/", 1)[-1],
        columns=columns,
        primary_key=tuple(json.loads(config[PK_PROPERTY])),
        vnode_count=int(config.get(VNODE_COUNT_PROPERTY) or DEFAULT_VNODE_COUNT),
        description=meta.description or "",
    )


def keys_of(rows: Iterable[Mapping[str, Any]], spec: UpstreamSpec) -> list[tuple]:
    """The primary key of each row, as tuples in key order."""
    return [tuple(r[k] for k in spec.primary_key) for r in rows]
