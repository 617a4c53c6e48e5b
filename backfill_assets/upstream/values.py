"""Values written to an upstream table, checked against its spec before anything is written.

Why a step of its own: a bad value must stop a batch before any byte is written, with a named
error that says which column and row rather than an Arrow or delta-rs error from inside the
write: a column not in the schema (UnknownColumn), a value of the wrong type or out of range
(WrongColumnType), a null key (NullPrimaryKey), a key twice in the rows of a bulk insert
(DuplicatePrimaryKey). ``check_value`` and ``RowChecker`` serve the DML writer
(upstream/writer/dml.py); ``conform_rows`` serves bulk inserts.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets import storage
from backfill_assets.core.errors import (
    BackfillError,
    DuplicatePrimaryKey,
    InvalidKeyType,
    NullPrimaryKey,
    UnknownColumn,
    WrongColumnType,
)
from backfill_assets.core.key_types import decimal_precision_scale
from backfill_assets.core.vnode import decimal_text
from backfill_assets.upstream.spec import VNODE, UpstreamSpec

_INT_BOUNDS = {"int": 2**31, "bigint": 2**63}


def check_value(column: str, typ: str, value: Any) -> Any:
    """``value`` normalised for a column of type ``typ``; WrongColumnType if it does not fit.
    (Null is checked by the caller.)"""
    def wrong(what: str) -> WrongColumnType:
        return WrongColumnType(
            f"column {column!r} is {typ} but got {value!r} ({type(value).__name__}): {what}"
        )

    if typ in _INT_BOUNDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("give a Python int")
        bound = _INT_BOUNDS[typ]
        if not -bound <= value < bound:
            raise wrong(f"out of range for {typ}")
        return value
    if typ == "string":
        if not isinstance(value, str):
            raise wrong("give a Python str")
        return value
    if typ == "date":
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
            raise wrong("give a datetime.date")
        return value
    if typ == "timestamp":
        if not isinstance(value, dt.datetime):
            raise wrong("give a datetime.datetime (UTC; naive values are taken as UTC)")
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)
    if typ == "double":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("give a Python float")
        return float(value)
    if typ == "boolean":
        if not isinstance(value, bool):
            raise wrong("give a Python bool")
        return value
    try:
        ps = decimal_precision_scale(typ)
    except InvalidKeyType:  # pragma: no cover - the spec only admits the types above
        raise wrong("unsupported type") from None
    try:
        text = decimal_text(value, *ps)
    except BackfillError as exc:
        raise wrong(str(exc)) from None
    return decimal.Decimal(text)


class RowChecker:
    """Validation and normalisation of one batch's rows and keys against a spec."""

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.pk = spec.primary_key

    def row(self, row: Mapping[str, Any], what: str, full: bool) -> dict[str, Any]:
        if not isinstance(row, Mapping):
            raise WrongColumnType(
                f"{what}: a row must be a mapping of column -> value, got {row!r}"
            )
        unknown = [c for c in row if c not in self.spec.columns]
        if unknown:
            raise UnknownColumn(
                f"{what}: column(s) {', '.join(map(repr, unknown))} are not in table "
                f"{self.spec.name!r} (columns: {', '.join(self.spec.columns)})"
            )
        out: dict[str, Any] = {}
        for k in self.pk:
            if row.get(k) is None:
                raise NullPrimaryKey(
                    f"{what}: primary-key column {k!r} is null or missing in {dict(row)!r}"
                )
        for c, typ in self.spec.columns.items():
            if c in row:
                v = row[c]
                out[c] = None if v is None else check_value(c, typ, v)
            elif full:
                out[c] = None
        return out

    def key(self, key: Any, what: str) -> tuple:
        if isinstance(key, Mapping):
            unknown = [c for c in key if c not in self.pk]
            if unknown:
                raise UnknownColumn(
                    f"{what}: {', '.join(map(repr, unknown))} are not primary-key columns of "
                    f"{self.spec.name!r} (key: {', '.join(self.pk)})"
                )
            values = tuple(key.get(k) for k in self.pk)
        elif isinstance(key, tuple):
            values = key
        else:
            values = (key,)
        if len(values) != len(self.pk):
            raise WrongColumnType(
                f"{what}: key {key!r} has {len(values)} values; the key is ({', '.join(self.pk)})"
            )
        out = []
        for k, v in zip(self.pk, values, strict=True):
            if v is None:
                raise NullPrimaryKey(f"{what}: primary-key column {k!r} is null in key {key!r}")
            out.append(check_value(k, self.spec.columns[k], v))
        return tuple(out)

    def key_of(self, row: Mapping[str, Any]) -> tuple:
        return tuple(row[k] for k in self.pk)


def conform_rows(spec: UpstreamSpec, rows: pa.Table) -> pa.Table:
    """``rows`` in the table's schema with the vnode column computed. Checks unknown columns,
    types (a safe cast), null and duplicate keys; missing non-key columns become null."""
    unknown = [c for c in rows.column_names if c not in spec.columns]
    if unknown:
        raise UnknownColumn(
            f"column(s) {', '.join(map(repr, unknown))} are not in table {spec.name!r} "
            f"(columns: {', '.join(spec.columns)})"
        )
    schema = spec.arrow_schema()
    arrays = []
    for f in schema:
        if f.name == VNODE:
            continue
        if f.name not in rows.column_names:
            if f.name in spec.primary_key:
                raise NullPrimaryKey(f"primary-key column {f.name!r} is missing from the rows")
            arrays.append(pa.nulls(rows.num_rows, f.type))
            continue
        col = rows.column(f.name)
        if f.name in spec.primary_key and col.null_count:
            raise NullPrimaryKey(
                f"primary-key column {f.name!r} has {col.null_count} null value(s)"
            )
        try:
            arrays.append(col.cast(f.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise WrongColumnType(
                f"column {f.name!r} is {spec.columns[f.name]} but the rows have {col.type}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
    pk = list(spec.primary_key)
    data_schema = pa.schema([f for f in schema if f.name != VNODE])
    data = pa.Table.from_arrays(arrays, schema=data_schema)
    if data.num_rows:
        counts = data.select(pk).group_by(pk).aggregate([([], "count_all")])
        dup = counts.filter(pc.greater(counts.column("count_all"), 1))
        if dup.num_rows:
            raise DuplicatePrimaryKey(
                f"{dup.num_rows} key(s) occur more than once in the rows, e.g. "
                f"{dup.select(pk).slice(0, 1).to_pylist()[0]}"
            )
    vnodes = storage.vnodes_for(data, spec.key_columns, spec.vnode_count)
    return data.append_column(schema.field(VNODE), vnodes)
