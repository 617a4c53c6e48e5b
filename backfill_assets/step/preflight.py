"""Everything about the upstream a step must know before it writes anything.

The checks here turn user mistakes (no change feed, a dropped column, a changed vnode count, a
no-shuffle MV over an upstream arranged differently: its mode's check, step/modes/) into named
errors that say what to do.
The upstream columns the MV reads (selected, key, and read by its filter and computed columns:
`used_columns`) are the only ones the backfill carries, and they are pinned in the progress
table's description at the first step: later steps compare the upstream against that pin, so
columns the MV does not read may be added, dropped, renamed or of any type (nested ones
included), and a read column dropped, renamed or retyped stops the MV with a clear message.
Under column mapping the pin also holds each column's identity, so a swap by RENAME or a
DROP + ADD of the same name and type is refused too when the MV uses the column
(step/column_identity.py). The pin also records the MV's schema as Spark's analysis of the
definition gave it: a later step under the same definition takes it from there, so a step
that reads no snapshot (a small catch-up on the driver) never starts a JVM.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from backfill_assets import storage
from backfill_assets.arrow.types import SUPPORTED, type_name
from backfill_assets.core.errors import (
    ChangeFeedDisabled,
    InvalidMVDefinition,
    MVDefinitionChanged,
    TableNotFound,
    UnsupportedColumnType,
    UpstreamNotFound,
    UpstreamSchemaChanged,
    VnodeCountChanged,
)
from backfill_assets.core.join_definition import refuse_unserved_joins
from backfill_assets.core.keys import KeyColumn, KeyOrder, parse_key_type
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.column_identity import (
    PIN_KEY,
    Identity,
    pinned_identities,
    refuse_changed_identities,
    used_columns,
)
from backfill_assets.step.request import UpstreamCheck
from backfill_assets.storage import arrow_schema, check_readable, column_identities, column_mapping


@dataclass(frozen=True)
class CheckedUpstream:
    """The upstream at the step's barrier version, as the backfill sees it."""

    version: int
    schema: pa.Schema  # the pinned columns: the ones the MV reads (upstream's vnode excluded)
    key_order: KeyOrder
    mv_schema: pa.Schema | None = None  # recorded with the pin, for the same definition
    identities: Mapping[str, Identity] = field(default_factory=dict)  # column -> its identity

    @property
    def key_types(self) -> tuple[str, ...]:
        return tuple(c.type for c in self.key_order.columns)

    def pin(self, d: MVDefinition, mv_schema: pa.Schema) -> str:
        """The description stored on the progress table: what this state was built for."""
        return json.dumps({
            "mv_schema": base64.b64encode(mv_schema.serialize().to_pybytes()).decode("ascii"),
            "upstream_columns": [[f.name, type_name(f.type)] for f in self.schema],
            PIN_KEY: pinned_identities(self.identities, self.schema.names),
            "primary_key": list(self.key_order.names),
            "vnode_count": d.vnode_count,
            "mode": d.mode,
            "definition": d.recorded(),
            "fingerprint": d.fingerprint,
            "created_at": time.time(),
        })


def checked_upstream(tables: MVTables, d: MVDefinition, version: int | None,
                     check: UpstreamCheck | None = None) -> CheckedUpstream:
    """Open and check the upstream at `version` (latest when None); raise before any write.
    ``check``: what the step's mode needs of the upstream besides (`Mode.check_upstream`)."""
    table = _opened(tables, d, version)
    check_readable(tables.upstream, table.version(), table)  # refused before any write
    if table.metadata().configuration.get("delta.enableChangeDataFeed") != "true":
        raise ChangeFeedDisabled(
            f"upstream {tables.upstream} has no change data feed, so the MV cannot follow its "
            "changes; enable it (ALTER TABLE ... SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true), or deltalake's "
            "DeltaTable.alter.set_table_properties) and rerun"
        )
    upstream = pa.schema([f for f in arrow_schema(table) if f.name != "vnode"])
    read = used_columns(d, upstream.names)
    carried = pa.schema([f for f in upstream if f.name in read])  # what the MV reads, only
    pinned = _pinned(tables)
    mv_schema = None
    identities = column_identities(table)
    if pinned is not None:  # first: a dropped column is the upstream's change, not the MV's
        carried = _against_pin(upstream, pinned, d, tables, identities)
        refuse_changed_identities(pinned, identities, column_mapping(table) != "none", d,
                                  tables)
        mv_schema = _pinned_mv_schema(pinned)
    for f in carried:
        _type_name(f, tables.upstream, d)
    columns = {f.name: _lenient_type_name(f) for f in upstream}
    key_order = _key_order(d, columns)
    d.validate(columns)
    refuse_unserved_joins(d)
    if check is not None:
        check(table, d, key_order, tables)
    return CheckedUpstream(table.version(), carried, key_order, mv_schema, identities)


def _pinned_mv_schema(pinned: dict) -> pa.Schema | None:
    """The MV schema the pin recorded, when the pin's definition was checked against this one
    (`_refuse_changed_definition`); None for state pinned before schemas were recorded."""
    if "definition" not in pinned or "mv_schema" not in pinned:
        return None
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(pinned["mv_schema"])))


def _opened(tables: MVTables, d: MVDefinition, version: int | None):
    """The upstream at `version` (its head: metadata and schema without the file list,
    `storage.delta.log_head`), else the latest."""
    missing = UpstreamNotFound(
        f"MV {d.name!r}: upstream {tables.upstream} does not exist; create it (for example "
        "with upstream_load_job) or fix `upstream` in the MV definition")
    if version is None:
        table = owned_tables.open_if_exists(tables.upstream, tables.storage_options)
        if table is None:
            raise missing
        return table
    try:
        return storage.open_head(tables.upstream, version, tables.storage_options)
    except TableNotFound:
        raise missing from None  # HistoryUnavailable (a cleaned-up version) passes through


def _type_name(field: pa.Field, where: str, d: MVDefinition) -> str:
    """The platform type of a column the MV reads; nested types (struct, array, map) and
    other types the MV cannot hold are refused by name. Columns the MV does not read are
    never carried, so their types do not matter (`_lenient_type_name`)."""
    try:
        return type_name(field.type)
    except Exception as exc:  # noqa: BLE001 - re-raised as the named error
        raise UnsupportedColumnType(
            f"upstream {where}: MV {d.name!r} reads column {field.name!r} of type "
            f"{field.type}, which the platform cannot carry into an MV (supported: "
            f"{SUPPORTED}); leave it out of the MV's columns, filter and computed columns "
            "(an MV that does not read it is built as usual), or add a column of a supported "
            "type to the upstream that holds what the MV needs of it"
        ) from exc


def _lenient_type_name(field: pa.Field) -> str:
    """A column's type name for the definition's checks: the Arrow text for a type the
    platform does not carry (such a column cannot be a key or read; `_type_name`)."""
    try:
        return type_name(field.type)
    except Exception:  # noqa: BLE001 - a type the MV does not read: named, not carried
        return str(field.type)


def _key_order(d: MVDefinition, columns: dict[str, str]) -> KeyOrder:
    """The definition's pk with each column's type resolved from the upstream schema."""
    resolved = []
    for col in d.primary_key:
        if col.name not in columns:
            raise InvalidMVDefinition(
                f"MV {d.name!r}: primary-key column {col.name!r} is not in the upstream "
                f"(columns: {', '.join(columns)}); fix primary_key in the MV definition"
            )
        actual = parse_key_type(columns[col.name], col.name)
        if col.type and parse_key_type(col.type, col.name) != actual:
            raise InvalidMVDefinition(
                f"MV {d.name!r}: primary-key column {col.name!r} is declared {col.type} but the "
                f"upstream has {actual}; fix the type in the MV definition"
            )
        resolved.append(KeyColumn(col.name, actual, col.descending, col.nulls_first))
    return KeyOrder(tuple(resolved))


def _pinned(tables: MVTables) -> dict | None:
    so = tables.storage_options
    try:  # not `table_exists`: delta-rs' is_deltatable holds the GIL while it lists the store
        latest = storage.latest_version(tables.progress, so)
    except TableNotFound:
        return None
    # the pin is the table's description: its head (metadata alone, brought forward by the
    # commits since the last one read) costs a commit file, where a load of the version
    # replays every file (each barrier makes a new progress version to load)
    progress = storage.open_head(tables.progress, latest, so)
    if not progress.metadata().description:
        return None
    return json.loads(progress.metadata().description)


def _against_pin(upstream: pa.Schema, pinned: dict, d: MVDefinition, tables: MVTables,
                 identities: Mapping[str, Identity]) -> pa.Schema:
    """The pinned columns as the upstream has them now; a pinned column dropped, renamed or
    retyped is refused. A pin records the columns the MV reads, so the upstream's other
    columns may come, go and be renamed (a pin that holds columns the MV does not read keeps
    them pinned, since the MV's replica holds them)."""
    if pinned["vnode_count"] != d.vnode_count:
        raise VnodeCountChanged(
            f"MV {d.name!r} was built with {pinned['vnode_count']} vnodes but the definition now "
            f"says {d.vnode_count}; set vnode_count back to {pinned['vnode_count']}, or drop "
            f"the MV's state under {tables.mv.rsplit('/', 1)[0]} to rebuild it"
        )
    if "definition" in pinned:  # state written before fingerprints were recorded: not checked
        _refuse_changed_definition(d, pinned, tables)
    now = {f.name: f for f in upstream}
    read = used_columns(d, [name for name, _ in pinned["upstream_columns"]])
    fields = []
    for name, type_ in pinned["upstream_columns"]:
        role = "reads" if name in read else "carries (its state pinned every upstream column)"
        if name not in now:
            raise UpstreamSchemaChanged(
                f"upstream {tables.upstream} {_gone(name, pinned, identities)}, which MV "
                f"{d.name!r} {role}; restore the column, or rebuild the MV over the upstream "
                f"as it is now with reset_mv_job (drops {tables.mv.rsplit('/', 1)[0]})"
            )
        if _lenient_type_name(now[name]) != type_:
            raise UpstreamSchemaChanged(
                f"upstream {tables.upstream} changed column {name!r} from {type_} to "
                f"{_lenient_type_name(now[name])}, which MV {d.name!r} {role}; restore the "
                f"type, or rebuild the MV with reset_mv_job (drops "
                f"{tables.mv.rsplit('/', 1)[0]})"
            )
        fields.append(now[name])
    return pa.schema(fields)


def _gone(name: str, pinned: dict, identities: Mapping[str, Identity]) -> str:
    """What became of a pinned column no longer in the upstream: renamed (its column-mapping
    identity now under another name) or dropped."""
    was = (pinned.get(PIN_KEY) or {}).get(name)
    if was:
        renamed = next((n for n, ident in identities.items() if list(ident) == list(was)), None)
        if renamed is not None:
            return f"renamed column {name!r} to {renamed!r}"
    return f"dropped column {name!r}"


def _refuse_changed_definition(d: MVDefinition, pinned: dict, tables: MVTables) -> None:
    """The MV's rows are f(upstream) for the definition recorded with its state: a barrier
    under another definition would mix two f's in one table."""
    if pinned.get("fingerprint") == d.fingerprint:
        return
    changes = d.changes_since(pinned["definition"]) or ["the definition's recorded form"]
    raise MVDefinitionChanged(
        f"MV {d.name!r} was built under another definition ({pinned.get('fingerprint')}, now "
        f"{d.fingerprint}): {'; '.join(changes)}. Its rows no longer match this definition: "
        "either restore the definition, or rebuild the MV under the new one with reset_mv_job "
        f"(drops {tables.mv.rsplit('/', 1)[0]}: MV, replica, progress), or give it a new name"
    )

