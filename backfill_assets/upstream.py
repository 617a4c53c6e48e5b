"""The platform's upstream table: create it, recover its spec, and write DML batches to it.

An upstream table is a Delta table with
- a declared primary key (one or more columns of type int, bigint, string, date, timestamp or
  decimal(p,s)), recorded in the table configuration (``backfill.primaryKey``) together with the
  vnode count (``backfill.vnodeCount``), so any reader recovers the spec with
  :func:`read_upstream_spec`;
- an int ``vnode`` partition column computed by the stable hash of the key
  (backfill_assets/core/vnode.py);
- the change data feed on.

:func:`apply_dml` applies one batch of inserts, updates, deletes, upserts and primary-key
changes as exactly ONE Delta version: one MERGE whose source rows carry the key to match
(``_m_<pk>``, ``_m_vnode``), an ``_op`` column and the new row. A pk change is a matched
update that rewrites the key, so the change feed shows it as ``update_preimage`` (old key) +
``update_postimage`` (new key). Batches are checked before anything is written: a null key
(NullPrimaryKey), a key used twice in the batch or an insert/pk-change target that already
exists (DuplicatePrimaryKey), an update/delete/pk-change of a key that does not exist
(MissingPrimaryKey), a column not in the schema (UnknownColumn), a value of the wrong type
(WrongColumnType). The table is assumed to have one writer at a time (the check reads the
table, then merges).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from backfill_assets import delta_store
from backfill_assets.arrow_types import arrow_type, type_name
from backfill_assets.core.errors import (
    BackfillError,
    DuplicatePrimaryKey,
    InvalidUpstreamSpec,
    MissingPrimaryKey,
    NotAnUpstreamTable,
    NullPrimaryKey,
    UnknownColumn,
    WrongColumnType,
)
from backfill_assets.core.keys import KeyColumn
from backfill_assets.core.vnode import (
    DEFAULT_VNODE_COUNT,
    MAX_VNODE_COUNT,
    canonical_key_text,
    decimal_precision_scale,
    decimal_text,
    normalize_key_type,
    vnode_of,
)

PK_PROPERTY = delta_store.PK_PROPERTY
VNODE_COUNT_PROPERTY = delta_store.VNODE_COUNT_PROPERTY
VNODE_COLUMN = delta_store.VNODE_COLUMN
COLUMN_TYPES = ("int", "bigint", "string", "date", "timestamp", "decimal(p,s)", "double",
                "boolean")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_INT_BOUNDS = {"int": 2**31, "bigint": 2**63}


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
            if not isinstance(name, str) or not _NAME_RE.match(name) or name == VNODE_COLUMN:
                raise InvalidUpstreamSpec(
                    f"column name {name!r} is not allowed: use lower-case letters, digits and _ "
                    f"starting with a letter; {VNODE_COLUMN!r} is the platform's partition column"
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
        fields.append(pa.field(VNODE_COLUMN, pa.int32(), nullable=False))
        return pa.schema(fields)

    def vnode_of(self, key: tuple) -> int:
        return vnode_of(tuple(key), self.key_types, self.vnode_count)


def _spell_type(typ: str) -> str:
    t = typ.strip().lower()
    ps = decimal_precision_scale(t)
    return f"decimal({ps[0]},{ps[1]})" if ps else t


# --------------------------------------------------------------------------------- create / read


def create_upstream(uri: str, spec: UpstreamSpec, storage_options=None) -> int:
    """Create the (empty) upstream table; returns its version (0)."""
    metadata = delta_store.arrangement_properties(spec.primary_key, spec.vnode_count)
    dt_ = delta_store.create_table(
        uri, spec.arrow_schema(), [VNODE_COLUMN], cdf=True, name=spec.name,
        description=spec.description or f"platform upstream table {spec.name}",
        metadata=metadata, storage_options=storage_options,
    )
    return dt_.version()


def read_upstream_spec(uri: str, storage_options=None) -> UpstreamSpec:
    """Recover the spec recorded by :func:`create_upstream` (column types from the schema)."""
    table = delta_store.open_table(uri, storage_options=storage_options)
    meta = table.metadata()
    config = meta.configuration
    if PK_PROPERTY not in config:
        raise NotAnUpstreamTable(
            f"{uri} has no recorded primary key ({PK_PROPERTY}): create it with create_upstream "
            "(or upstream_load_job), or declare the key where the backfill is configured"
        )
    schema = delta_store.arrow_schema(table)
    columns = {f.name: type_name(f.type) for f in schema if f.name != VNODE_COLUMN}
    return UpstreamSpec(
        name=meta.name or uri.rstrip("/").rsplit("/", 1)[-1],
        columns=columns,
        primary_key=tuple(json.loads(config[PK_PROPERTY])),
        vnode_count=int(config.get(VNODE_COUNT_PROPERTY) or DEFAULT_VNODE_COUNT),
        description=meta.description or "",
    )


# ------------------------------------------------------------------------------------ batches


@dataclass
class DmlBatch:
    """One batch of changes, applied as one Delta version.

    - ``inserts``: full rows (missing non-key columns are null); the key must not exist.
    - ``updates``: rows with the key; the other columns given are set, the rest kept.
    - ``deletes``: keys (a tuple in key order, a mapping with the key columns, or a bare value
      for a one-column key); the key must exist.
    - ``upserts``: full rows; inserted, or replacing the row with the same key.
    - ``pk_changes``: (old key, new full row) pairs (or a mapping old key -> new row); the old
      key must exist and the new one must not.
    A key may be used by one change of a batch only.
    """

    inserts: Sequence[Mapping[str, Any]] = ()
    updates: Sequence[Mapping[str, Any]] = ()
    deletes: Sequence[Any] = ()
    upserts: Sequence[Mapping[str, Any]] = ()
    pk_changes: Sequence[tuple[Any, Mapping[str, Any]]] | Mapping[Any, Mapping[str, Any]] = ()

    def __len__(self) -> int:
        return (len(self.inserts) + len(self.updates) + len(self.deletes) + len(self.upserts)
                + len(self.pk_changes))


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
    ps = decimal_precision_scale(typ)
    if ps is None:  # pragma: no cover - the spec only admits the types above
        raise wrong("unsupported type")
    try:
        text = decimal_text(value, *ps)
    except BackfillError as exc:
        raise wrong(str(exc)) from None
    return decimal.Decimal(text)


class _Checker:
    """Validation and normalisation of one batch against a spec."""

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


@dataclass
class _Change:
    op: str  # insert | update | delete | upsert | pk_change
    match: tuple  # the key the target row is matched on
    row: dict[str, Any] | None  # new values (None for delete)
    new_key: tuple | None = None  # the key the change creates (insert, upsert, pk_change)


def prepare_batch(spec: UpstreamSpec, batch: DmlBatch) -> list[_Change]:
    """Check a batch against the spec (not the table): types, nulls, unknown columns,
    duplicate keys within the batch. Returns the changes in a uniform shape."""
    c = _Checker(spec)
    changes: list[_Change] = []
    for i, r in enumerate(batch.inserts):
        row = c.row(r, f"insert #{i}", full=True)
        changes.append(_Change("insert", c.key_of(row), row, c.key_of(row)))
    for i, r in enumerate(batch.updates):
        row = c.row(r, f"update #{i}", full=False)
        changes.append(_Change("update", c.key_of(row), row))
    for i, k in enumerate(batch.deletes):
        changes.append(_Change("delete", c.key(k, f"delete #{i}"), None))
    for i, r in enumerate(batch.upserts):
        row = c.row(r, f"upsert #{i}", full=True)
        changes.append(_Change("upsert", c.key_of(row), row, c.key_of(row)))
    pairs = batch.pk_changes.items() if isinstance(batch.pk_changes, Mapping) else batch.pk_changes
    for i, pair in enumerate(pairs):
        try:
            old, new = pair
        except (TypeError, ValueError):
            raise WrongColumnType(
                f"pk change #{i}: give (old key, new row), got {pair!r}"
            ) from None
        old_key = c.key(old, f"pk change #{i} (old key)")
        row = c.row(new, f"pk change #{i} (new row)", full=True)
        changes.append(_Change("pk_change", old_key, row, c.key_of(row)))

    seen: dict[str, str] = {}
    types = spec.key_types
    for ch in changes:
        keys = [ch.match] + ([ch.new_key] if ch.op == "pk_change" else [])
        for key in keys:
            text = canonical_key_text(key, types)
            if text in seen:
                raise DuplicatePrimaryKey(
                    f"key {key!r} is used twice in one batch ({seen[text]} and {ch.op}): a key may "
                    "take one change per batch; put later changes of it in the next batch"
                )
            seen[text] = ch.op
    return changes


def _key_table(spec: UpstreamSpec, keys: Sequence[tuple]) -> pa.Table:
    cols = {k: pa.array([key[i] for key in keys], arrow_type(spec.columns[k]))
            for i, k in enumerate(spec.primary_key)}
    cols["_i"] = pa.array(range(len(keys)), pa.int64())
    return pa.table(cols)


def existing_keys(uri: str, spec: UpstreamSpec, keys: Sequence[tuple],
                  storage_options=None, version: int | None = None) -> list[bool]:
    """For each key, whether the table (at ``version``, default latest) holds it. Reads only
    the key columns of the vnode partitions the keys hash to."""
    if not keys:
        return []
    vnodes = {spec.vnode_of(k) for k in keys}
    current = delta_store.read_table(uri, version, columns=list(spec.primary_key),
                                     predicate=delta_store.vnode_predicate(vnodes),
                                     storage_options=storage_options)
    found = [False] * len(keys)
    if current.num_rows == 0:
        return found
    probe = _key_table(spec, keys)
    current = current.cast(pa.schema([probe.schema.field(k) for k in spec.primary_key]))
    joined = probe.join(current, keys=list(spec.primary_key), join_type="inner")
    for i in joined.column("_i").to_pylist():
        found[i] = True
    return found


def _check_against_table(uri: str, spec: UpstreamSpec, changes: list[_Change],
                         storage_options, version: int) -> None:
    must_exist = [ch for ch in changes if ch.op in ("update", "delete", "pk_change")]
    must_not = [ch for ch in changes if ch.op in ("insert", "pk_change")]
    probe = [ch.match for ch in must_exist] + [ch.new_key for ch in must_not]
    found = existing_keys(uri, spec, probe, storage_options, version)  # type: ignore[arg-type]
    for ch, ok in zip(must_exist, found[: len(must_exist)], strict=True):
        if not ok:
            raise MissingPrimaryKey(
                f"{ch.op} of key {ch.match!r}: no row of {spec.name!r} has that key; use an "
                "upsert to insert-or-replace"
            )
    for ch, ok in zip(must_not, found[len(must_exist):], strict=True):
        if ok:
            raise DuplicatePrimaryKey(
                f"{ch.op} to key {ch.new_key!r}: {spec.name!r} already has a row with that key; "
                "use an update/upsert, or delete it first (in an earlier batch)"
            )


def _source_table(spec: UpstreamSpec, changes: list[_Change]) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    for i, k in enumerate(spec.primary_key):
        cols[f"_m_{k}"] = pa.array([ch.match[i] for ch in changes], arrow_type(spec.columns[k]))
    cols["_m_vnode"] = pa.array([spec.vnode_of(ch.match) for ch in changes], pa.int32())
    cols["_op"] = pa.array([ch.op for ch in changes], pa.string())
    for c, typ in spec.columns.items():
        cols[c] = pa.array([(ch.row or {}).get(c) for ch in changes], arrow_type(typ))
    cols[VNODE_COLUMN] = pa.array(
        [spec.vnode_of(tuple(ch.row[k] for k in spec.primary_key)) if ch.row else None
         for ch in changes], pa.int32())
    for c in spec.value_columns:
        cols[f"_set_{c}"] = pa.array(
            [ch.op != "delete" and (ch.op != "update" or c in (ch.row or {})) for ch in changes],
            pa.bool_())
    return pa.table(cols)


def apply_dml(uri: str, batch: DmlBatch, *, spec: UpstreamSpec | None = None,
              storage_options=None, commit_metadata: Mapping[str, Any] | None = None) -> int:
    """Apply ``batch`` as exactly one new Delta version and return it. An empty batch writes
    nothing and returns the current version. Rejected batches raise before writing."""
    spec = spec or read_upstream_spec(uri, storage_options)
    changes = prepare_batch(spec, batch)
    table = delta_store.open_table(uri, storage_options=storage_options)
    if not changes:
        return table.version()
    _check_against_table(uri, spec, changes, storage_options, table.version())
    delta_store.check_commits_safe(uri, storage_options)

    source = _source_table(spec, changes)
    vnodes = sorted(set(source.column("_m_vnode").to_pylist()))
    on = " AND ".join(
        [delta_store.vnode_predicate(vnodes, f"t.{VNODE_COLUMN}"), f"t.{VNODE_COLUMN} = s._m_vnode"]
        + [f"t.{k} = s._m_{k}" for k in spec.primary_key]
    )
    updates = {k: f"s.{k}" for k in spec.primary_key}
    updates.update({c: f"CASE WHEN s._set_{c} THEN s.{c} ELSE t.{c} END"
                    for c in spec.value_columns})
    updates[VNODE_COLUMN] = f"s.{VNODE_COLUMN}"
    inserts = {c: f"s.{c}" for c in [*spec.columns, VNODE_COLUMN]}
    counts = {op: sum(1 for ch in changes if ch.op == op)
              for op in ("insert", "update", "delete", "upsert", "pk_change")}
    meta = {"backfill.dml": counts, **(commit_metadata or {})}
    (
        table.merge(source, on, source_alias="s", target_alias="t", streamed_exec=False,
                    commit_properties=delta_store.commit_properties(meta))
        .when_matched_delete("s._op = 'delete'")
        .when_matched_update(updates, "s._op IN ('update', 'upsert', 'pk_change')")
        .when_not_matched_insert(inserts, "s._op IN ('insert', 'upsert')")
        .execute()
    )
    return table.version()


# ------------------------------------------------------------------------------- bulk insert


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
        if f.name == VNODE_COLUMN:
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
    data_schema = pa.schema([f for f in schema if f.name != VNODE_COLUMN])
    data = pa.Table.from_arrays(arrays, schema=data_schema)
    if data.num_rows:
        counts = data.select(pk).group_by(pk).aggregate([([], "count_all")])
        dup = counts.filter(pc.greater(counts.column("count_all"), 1))
        if dup.num_rows:
            raise DuplicatePrimaryKey(
                f"{dup.num_rows} key(s) occur more than once in the rows, e.g. "
                f"{dup.select(pk).slice(0, 1).to_pylist()[0]}"
            )
    vnodes = delta_store.vnodes_for(data, spec.key_columns, spec.vnode_count)
    return data.append_column(schema.field(VNODE_COLUMN), vnodes)


def insert_rows(uri: str, rows: pa.Table, *, spec: UpstreamSpec | None = None,
                storage_options=None, check_existing: bool = True,
                commit_metadata: Mapping[str, Any] | None = None) -> int:
    """Bulk-insert an Arrow table as one append version (partitioned by vnode; the change
    feed reads its rows as inserts). Returns the new version."""
    spec = spec or read_upstream_spec(uri, storage_options)
    data = conform_rows(spec, rows)
    if data.num_rows == 0:
        return delta_store.latest_version(uri, storage_options)
    if check_existing:
        keys = list(zip(*(data.column(k).to_pylist() for k in spec.primary_key), strict=True))
        found = existing_keys(uri, spec, keys, storage_options)
        if any(found):
            dup = keys[found.index(True)]
            raise DuplicatePrimaryKey(
                f"{sum(found)} inserted key(s) already exist in {spec.name!r}, e.g. {dup!r}"
            )
    delta_store.check_commits_safe(uri, storage_options)
    write_deltalake(uri, data, mode="append", storage_options=storage_options,
                    commit_properties=delta_store.commit_properties(
                        {"backfill.dml": {"insert": data.num_rows}, **(commit_metadata or {})}))
    return delta_store.latest_version(uri, storage_options)


def row_count(uri: str, version: int | None = None, storage_options=None) -> int:
    """Rows of a version (from the files' statistics)."""
    table = delta_store.open_table(uri, version, storage_options)
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    counts = actions.column("num_records")
    if counts.null_count:
        return delta_store.read_table(uri, version, columns=list(read_upstream_spec(
            uri, storage_options).primary_key)[:1], storage_options=storage_options).num_rows
    return int(pc.sum(counts).as_py())


def keys_of(rows: Iterable[Mapping[str, Any]], spec: UpstreamSpec) -> list[tuple]:
    return [tuple(r[k] for k in spec.primary_key) for r in rows]
