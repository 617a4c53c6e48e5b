"""Writes to an upstream table: DML batches, bulk inserts, and the key lookups they check with.

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

:func:`insert_rows` bulk-inserts an Arrow table as one append version. The table and its spec
are in upstream/spec.py, the value checks in upstream/values.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from backfill_assets import storage
from backfill_assets.arrow.types import arrow_type
from backfill_assets.core.errors import DuplicatePrimaryKey, MissingPrimaryKey, WrongColumnType
from backfill_assets.core.vnode import canonical_key_text
from backfill_assets.upstream.spec import VNODE, UpstreamSpec, read_upstream_spec
from backfill_assets.upstream.values import RowChecker, conform_rows


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


@dataclass
class _Change:
    op: str  # insert | update | delete | upsert | pk_change
    match: tuple  # the key the target row is matched on
    row: dict[str, Any] | None  # new values (None for delete)
    new_key: tuple | None = None  # the key the change creates (insert, upsert, pk_change)


def prepare_batch(spec: UpstreamSpec, batch: DmlBatch) -> list[_Change]:
    """Check a batch against the spec (not the table): types, nulls, unknown columns,
    duplicate keys within the batch. Returns the changes in a uniform shape."""
    c = RowChecker(spec)
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
    current = storage.read_table(uri, version, columns=list(spec.primary_key),
                                     predicate=storage.vnode_predicate(vnodes),
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
    cols[VNODE] = pa.array(
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
    table = storage.open_table(uri, storage_options=storage_options)
    if not changes:
        return table.version()
    _check_against_table(uri, spec, changes, storage_options, table.version())
    storage.check_commits_safe(uri, storage_options)

    source = _source_table(spec, changes)
    vnodes = sorted(set(source.column("_m_vnode").to_pylist()))
    on = " AND ".join(
        [storage.vnode_predicate(vnodes, f"t.{VNODE}"), f"t.{VNODE} = s._m_vnode"]
        + [f"t.{k} = s._m_{k}" for k in spec.primary_key]
    )
    updates = {k: f"s.{k}" for k in spec.primary_key}
    updates.update({c: f"CASE WHEN s._set_{c} THEN s.{c} ELSE t.{c} END"
                    for c in spec.value_columns})
    updates[VNODE] = f"s.{VNODE}"
    inserts = {c: f"s.{c}" for c in [*spec.columns, VNODE]}
    counts = {op: sum(1 for ch in changes if ch.op == op)
              for op in ("insert", "update", "delete", "upsert", "pk_change")}
    meta = {"backfill.dml": counts, **(commit_metadata or {})}
    (
        table.merge(source, on, source_alias="s", target_alias="t", streamed_exec=False,
                    commit_properties=storage.commit_properties(meta))
        .when_matched_delete("s._op = 'delete'")
        .when_matched_update(updates, "s._op IN ('update', 'upsert', 'pk_change')")
        .when_not_matched_insert(inserts, "s._op IN ('insert', 'upsert')")
        .execute()
    )
    return table.version()


# ------------------------------------------------------------------------------- bulk insert


def insert_rows(uri: str, rows: pa.Table, *, spec: UpstreamSpec | None = None,
                storage_options=None, check_existing: bool = True,
                commit_metadata: Mapping[str, Any] | None = None) -> int:
    """Bulk-insert an Arrow table as one append version (partitioned by vnode; the change
    feed reads its rows as inserts). Returns the new version."""
    spec = spec or read_upstream_spec(uri, storage_options)
    data = conform_rows(spec, rows)
    if data.num_rows == 0:
        return storage.latest_version(uri, storage_options)
    if check_existing:
        keys = list(zip(*(data.column(k).to_pylist() for k in spec.primary_key), strict=True))
        found = existing_keys(uri, spec, keys, storage_options)
        if any(found):
            dup = keys[found.index(True)]
            raise DuplicatePrimaryKey(
                f"{sum(found)} inserted key(s) already exist in {spec.name!r}, e.g. {dup!r}"
            )
    storage.check_commits_safe(uri, storage_options)
    write_deltalake(uri, data, mode="append", storage_options=storage_options,
                    commit_properties=storage.commit_properties(
                        {"backfill.dml": {"insert": data.num_rows}, **(commit_metadata or {})}))
    return storage.latest_version(uri, storage_options)


def row_count(uri: str, version: int | None = None, storage_options=None) -> int:
    """Rows of a version (from the files' statistics)."""
    table = storage.open_table(uri, version, storage_options)
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    counts = actions.column("num_records")
    if counts.null_count:
        return storage.read_table(uri, version, columns=list(read_upstream_spec(
            uri, storage_options).primary_key)[:1], storage_options=storage_options).num_rows
    return int(pc.sum(counts).as_py())
