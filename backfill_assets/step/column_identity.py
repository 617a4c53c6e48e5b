"""Which upstream column a name means: column-mapping identities in the progress pin.

Under Delta column mapping (``delta.columnMapping.mode`` name or id) a column's name is only a
label on a column whose identity is its ``delta.columnMapping.id`` and physical name (what its
data files hold). RENAME COLUMN moves a label to another column, so a swap (a -> swap, b -> a,
swap -> b) keeps every name and type; DROP COLUMN + ADD COLUMN of the same name and type gives
the name a new, empty column. Names and types alone pass both, and the MV would keep the old
column's values beside the new one's changes. So the pin records the identity of each column
the MV reads (`pinned_identities`; the pin holds no others) and a later step refuses, with
`UpstreamSchemaChanged`, a column the MV uses whose identity changed
(`refuse_changed_identities`). Columns the MV does not read may change identity: its rows
do not depend on them. Pins written before identities were recorded are accepted as they are,
and an upstream without column mapping has nothing to compare (its names are its identities,
which the name check already covers).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from backfill_assets.core.errors import UpstreamSchemaChanged
from backfill_assets.core.expressions import columns_of, parse
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables

Identity = tuple[int | None, str]  # (delta.columnMapping.id, physical name)
PIN_KEY = "column_identities"


def pinned_identities(identities: Mapping[str, Identity], names: Iterable[str]
                      ) -> dict[str, list]:
    """The pin's record of ``names``: name -> [id, physical name] (JSON-ready)."""
    return {n: list(identities[n]) for n in names if n in identities}


def used_columns(d: MVDefinition, names: Iterable[str]) -> set[str]:
    """The upstream columns among ``names`` that the MV's rows depend on: selected and key
    columns, and the columns its filter and computed columns read. An expression outside the
    parsed subset (core/expressions.py) counts every column whose name is a word of its text
    (`_identifiers`), so a column it might read is never missed. Case-insensitive, as Spark
    resolves names. Only these columns are carried and pinned (step/preflight.py)."""
    used = {c.lower() for c in d.columns} | {c.name.lower() for c in d.primary_key}
    used |= {c.lower() for j in d.joins for c in j.fact_columns}  # a join's `on` columns
    names = list(names)
    texts = [d.filter, *(c.expr for c in d.computed), *(g.expr for g in d.group_by),
             *(a.arg for a in d.aggregates)]
    for text in texts:
        if not text:
            continue
        node = parse(text)
        if node is not None:
            used |= {c.lower() for c in columns_of(node)}
            continue
        used |= _identifiers(text)
    return {n for n in names if n.lower() in used}


_IDENTIFIER = re.compile(r"`((?:[^`]|``)+)`|([^\W\d]\w*)")


def _identifiers(text: str) -> set[str]:
    """Every name an expression outside the parsed subset may refer to: its backquoted names
    and its bare words (function names and the words of string literals too: a column named
    like one counts as read, never the other way round). Whole words, so a short column name
    inside a longer word (``e`` in ``upper``) is not taken for a read."""
    return {(quoted.replace("``", "`") if quoted else bare).lower()
            for quoted, bare in _IDENTIFIER.findall(text)}


def refuse_changed_identities(pinned: Mapping, now: Mapping[str, Identity], mapped: bool,
                              d: MVDefinition, tables: MVTables) -> None:
    """Raise UpstreamSchemaChanged for the first column the MV uses whose identity is not the
    pinned one. Nothing to compare when the pin predates identities (no ``PIN_KEY``) or the
    upstream has no column mapping now (its names are its identities)."""
    recorded = pinned.get(PIN_KEY)
    if not recorded or not mapped:
        return
    was = {name: (ident[0], ident[1]) for name, ident in recorded.items()}
    for name in sorted(used_columns(d, was)):
        if name in now and not _same(was[name], now[name]):
            raise UpstreamSchemaChanged(_message(name, was, now, d, tables))


def _same(was: Identity, now: Identity) -> bool:
    """Physical names must match; ids too where both are known (a pin written before the
    upstream took column mapping has none: Delta gives each column its name as physical name
    when it switches mapping on, so the name still identifies it)."""
    return was[1] == now[1] and (was[0] is None or now[0] is None or was[0] == now[0])


def _message(name: str, was: Mapping[str, Identity], now: Mapping[str, Identity],
             d: MVDefinition, tables: MVTables) -> str:
    """Which column, what became of it, and what to do. The pin holds only the columns the MV
    reads, so the column a swap moved under ``name`` may be one it never recorded: then the
    message says where the pinned column went instead."""
    other = next((n for n, ident in was.items() if n != name and _same(ident, now[name])), None)
    moved = next((n for n, ident in now.items() if n != name and _same(was[name], ident)), None)
    if other is not None:
        what = (f"column {name!r} is now the column that was {other!r} (physical name "
                f"{now[name][1]}; a RENAME COLUMN moved the name)")
        undo = "rename the columns back"
    elif moved is not None:
        what = (f"column {name!r} is now another column (physical name {now[name][1]}); the "
                f"column it named is now {moved!r} (a RENAME COLUMN moved the name)")
        undo = "rename the columns back"
    else:
        what = (f"column {name!r} was dropped and re-added (physical name {was[name][1]}, "
                f"now {now[name][1]}): the MV holds the dropped column's values")
        undo = "RESTORE TABLE the upstream to a version before the drop"
    return (f"upstream {tables.upstream}: {what}, which MV {d.name!r} uses; its rows were "
            f"built from the column as pinned at its first step. Either {undo} and rerun, or "
            "rebuild the MV over the upstream as it is now with reset_mv_job (drops "
            f"{tables.mv.rsplit('/', 1)[0]}: MV, replica, progress)")
