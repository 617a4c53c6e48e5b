"""The one codec for the backfill_progress row.

Row layout (as the reference's state table, plus the version the row is valid at)::

    | vnode | pk columns... | backfill_finished | row_count | version |

NotStarted has no row. A vnode whose snapshot was empty is finished with an all-null pk and
row_count 0. Why one codec: the writer (commit), the reader (recovery), the progress carried in
MV commit metadata (``to_json``/``from_json``), the metadata shown in Dagster and the asset
checks must never disagree on what a row means.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

from backfill_assets.core.errors import (
    BackfillError,
    CorruptProgressRow,
    InvalidMVDefinition,
    ProgressSchemaMismatch,
)
from backfill_assets.core.keys import KeyColumn, KeyOrder, parse_key_type, to_utc
from backfill_assets.core.progress import (
    Completed,
    InProgress,
    NotStarted,
    VnodeProgress,
    check_progress,
    check_vnode,
    is_count,
)

VNODE, FINISHED, ROW_COUNT, VERSION = "vnode", "backfill_finished", "row_count", "version"
RESERVED_COLUMNS = frozenset({VNODE, FINISHED, ROW_COUNT, VERSION})
_ALIASES = {"integer": "int", "long": "bigint", "bool": "boolean"}


def check_pk_names(key_order: KeyOrder) -> None:
    """pk columns share the progress row with the metadata columns: names must not clash."""
    clash = [n for n in key_order.names if n.lower() in RESERVED_COLUMNS]
    if clash:
        raise InvalidMVDefinition(
            f"pk column(s) {clash} clash with the progress table's columns "
            f"{sorted(RESERVED_COLUMNS)}: rename them in the upstream table or pick another "
            "primary key"
        )


def progress_schema(key_order: KeyOrder) -> list[tuple[str, str]]:
    """Column names and Spark types of backfill_progress (pk columns are nullable)."""
    check_pk_names(key_order)
    pk = [(c.name, c.type) for c in key_order.columns]
    return [(VNODE, "int"), *pk, (FINISHED, "boolean"), (ROW_COUNT, "bigint"), (VERSION, "bigint")]


def encode(
    vnode: int, progress: VnodeProgress, version: int | None, key_order: KeyOrder
) -> dict[str, object] | None:
    """The progress row of a vnode, or None for NotStarted (which has no row)."""
    if isinstance(progress, NotStarted):
        return None
    check_pk_names(key_order)
    progress, version = check_progress(key_order, check_vnode(vnode), progress, version)
    row: dict[str, object] = {VNODE: vnode}
    row.update(zip(key_order.names, progress.current_pos, strict=True))  # type: ignore[arg-type]
    row.update({FINISHED: progress.finished, ROW_COUNT: progress.row_count, VERSION: version})
    return row


def decode(row: Mapping[str, object], key_order: KeyOrder) -> tuple[int, VnodeProgress, int]:
    """(vnode, progress, version) of a progress row; refuses schema mismatches and bad values."""
    validate_schema(row.keys(), key_order)
    vnode = row[VNODE]

    def corrupt(what: str) -> CorruptProgressRow:
        return CorruptProgressRow(
            f"progress row for vnode {vnode!r} is corrupt: {what}; the backfill_progress "
            "table was edited or written by another version: drop the MV's state to rebuild it"
        )

    if not is_count(vnode):
        raise corrupt("vnode must be a non-negative int")
    finished = row[FINISHED]
    if type(finished) is not bool:
        raise corrupt(f"backfill_finished {finished!r} must be true or false")
    pos = tuple(row[n] for n in key_order.names)
    nulls = [v is None for v in pos]
    if all(nulls) and not finished:
        raise corrupt("backfill_finished=false with a null pk (only an empty finished vnode "
                      "has a null position)")
    if any(nulls) and not all(nulls):
        raise corrupt(f"pk {pos!r} is partly null")
    kind = Completed if finished else InProgress
    checked, version = check_progress(
        key_order, vnode, kind(pos, row[ROW_COUNT]), row[VERSION]  # type: ignore[arg-type]
    )
    return vnode, checked, version  # type: ignore[return-value]


def validate_schema(columns: Iterable[str] | Mapping[str, str], key_order: KeyOrder) -> None:
    """Refuse a progress table whose columns (and types, when given) do not fit the pk."""
    expected = dict(progress_schema(key_order))
    names = list(columns)
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    wrong = []
    if isinstance(columns, Mapping):
        wrong = [
            f"{n} is {t}, expected {expected[n]}"
            for n, t in columns.items()
            if n in expected and _canonical_type(t) != expected[n]
        ]
    if missing or extra or wrong:
        details = "; ".join(
            part
            for part in (
                f"missing columns {missing}" if missing else "",
                f"unexpected columns {extra}" if extra else "",
                f"wrong types: {', '.join(wrong)}" if wrong else "",
            )
            if part
        )
        raise ProgressSchemaMismatch(
            f"backfill_progress does not match the MV's primary key {list(key_order.names)} "
            f"({details}): the MV definition's primary key changed since the backfill "
            "started; drop the MV's state (downstream_mv and backfill_progress) to rebuild "
            "it, or restore the previous primary key"
        )


def _canonical_type(t: object) -> str:
    text = re.sub(r"\s+", "", t).lower() if isinstance(t, str) else repr(t)
    text = _ALIASES.get(text, text)
    try:
        return parse_key_type(text)
    except BackfillError:
        return text


def to_json(row: Mapping[str, object] | None, key_order: KeyOrder) -> dict[str, object] | None:
    """An encoded row with JSON-safe values (dates and timestamps as ISO text in UTC, decimals
    as plain text), e.g. to carry progress in Delta commit metadata. None stays None."""
    if row is None:
        return None
    out = dict(row)
    for col in key_order.columns:
        value = row.get(col.name)
        if isinstance(value, dt.datetime):
            out[col.name] = to_utc(value).isoformat(timespec="microseconds")
        elif isinstance(value, dt.date):
            out[col.name] = value.isoformat()
        elif isinstance(value, Decimal):
            out[col.name] = format(value, "f")
    return out


def from_json(obj: Mapping[str, object] | str | None, key_order: KeyOrder) -> dict | None:
    """The row ``to_json`` made (also given as JSON text), ready for ``decode``."""
    if obj is None:
        return None
    try:
        row = dict(json.loads(obj) if isinstance(obj, str) else obj)
        for col in key_order.columns:
            if row.get(col.name) is not None:
                row[col.name] = _pk_from_json(col, row[col.name])
    except (ValueError, TypeError, InvalidOperation) as e:
        raise CorruptProgressRow(
            f"progress carried as JSON cannot be read ({obj!r}: {e}); the commit metadata was "
            "written by another version or edited: drop the MV's state to rebuild it"
        ) from e
    return row


def _pk_from_json(col: KeyColumn, value: object) -> object:
    if col.type in ("date", "timestamp") or col.type.startswith("decimal"):
        if not isinstance(value, str):
            raise TypeError(f"{col.name}: expected text, got {value!r}")
        if col.type == "date":
            return dt.date.fromisoformat(value)
        if col.type == "timestamp":
            return dt.datetime.fromisoformat(value)
        return Decimal(value)
    return value
