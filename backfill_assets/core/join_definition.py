"""An MV's `joins`: lookup joins of the upstream (the fact) with dimension tables, parsed and
checked before anything is written.

Why a lookup join only: each join matches a fact row with at most one dimension row, because
it joins on the dimension's whole declared key (unique, like a primary key). So the MV stays
keyed by the upstream's primary key, a fact row yields at most one joined row, and a
dimension change reaches exactly the fact rows that reference its key (docs/JOINS.md).

A join item (plain data, as in the MV's YAML):
``{table: customers, key: [id], on: {customer: id}, columns: [region, {name: tier_name,
column: tier}], kind: left}``
- ``table``: the dimension (an upstream table or another MV), never the upstream itself;
- ``key``: the dimension's declared key; ``on`` maps upstream columns to *all* of it;
- ``columns``: dimension columns brought in, each under its own name or a ``{name, column}``
  alias; the names are usable in ``columns``, ``filter``, ``computed``, ``group_by`` and
  ``aggregates`` like upstream columns, and may clash with no other name;
- ``kind``: ``inner`` (the default, SQL's JOIN) or ``left`` (any case).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backfill_assets.core.errors import (
    DimensionWithoutChangeFeed,
    InvalidJoin,
    InvalidKeyType,
    JoinMVNotServed,
)
from backfill_assets.core.key_types import parse_key_type
from backfill_assets.core.names import VNODE

KINDS = ("inner", "left")  # the first is the default
_FIELDS = ("table", "key", "on", "columns", "kind")
_REQUIRED = ("table", "key", "on")


@dataclass(frozen=True)
class JoinedColumn:
    """A dimension column brought into the MV's rows under ``name``."""

    name: str
    column: str


@dataclass(frozen=True)
class Join:
    """One lookup join: ``on`` pairs (upstream column, dimension key column) in the order of
    the declared ``key``."""

    table: str
    key: tuple[str, ...]
    on: tuple[tuple[str, str], ...]
    columns: tuple[JoinedColumn, ...] = ()
    kind: str = KINDS[0]

    @property
    def fact_columns(self) -> tuple[str, ...]:
        """The upstream columns of the join key, in the order of the dimension's key."""
        by_key = {dim: fact for fact, dim in self.on}
        return tuple(by_key.get(k, "") for k in self.key)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def recorded(self) -> list[object]:
        """Plain data for the MV's recorded form (and so its fingerprint)."""
        return [self.table, list(self.key), [list(p) for p in self.on],
                [[c.name, c.column] for c in self.columns], self.kind]


def parse_joins(value: object) -> tuple[Join, ...]:
    """``joins`` from plain data: a list of join mappings (or built `Join`s)."""
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, list | tuple):
        raise InvalidJoin(f"joins must be a list of join mappings ({', '.join(_FIELDS)}), "
                          f"got {value!r}")
    return tuple(i if isinstance(i, Join) else _join(i) for i in items)


def _join(item: object) -> Join:
    if not isinstance(item, Mapping):
        raise InvalidJoin(f"join item {item!r} must be a mapping with keys {', '.join(_FIELDS)}")
    # YAML 1.1 (PyYAML, the catalog's reader) reads the key `on` as the boolean true
    item = {("on" if k is True else k): v for k, v in item.items()}
    unknown = sorted(set(item) - set(_FIELDS))
    missing = [f for f in _REQUIRED if f not in item]
    if unknown or missing:
        raise InvalidJoin(
            f"join of {item.get('table', '?')!r}: "
            + (f"unknown fields {unknown} " if unknown else "")
            + (f"missing fields {missing} " if missing else "")
            + f"(allowed: {', '.join(_FIELDS)}; e.g. {{table: customers, key: [id], "
            "on: {customer: id}, columns: [region], kind: left})")
    key = item["key"]
    key = [key] if isinstance(key, str) else key
    on = item["on"]
    names = [*key, *on, *on.values()] if isinstance(key, list | tuple) and isinstance(
        on, Mapping) else [None]
    if not all(isinstance(n, str) and n for n in names):
        raise InvalidJoin(
            f"join of {item['table']!r}: key must be a list of the dimension's key columns and "
            f"on a mapping upstream column -> dimension key column (got key {item['key']!r}, "
            f"on {on!r})")
    columns = item.get("columns", ())
    columns = [columns] if isinstance(columns, str) else columns
    if not isinstance(columns, list | tuple):
        raise InvalidJoin(f"join of {item['table']!r}: columns must be a list, got {columns!r}")
    by_dim = {dim: fact for fact, dim in on.items()}
    pairs = [(by_dim[k], k) for k in key if k in by_dim]
    pairs += [(f, d) for f, d in on.items() if d not in key]  # refused later, by name
    kind = item.get("kind", KINDS[0])
    return Join(item["table"], tuple(key), tuple(pairs),  # type: ignore[arg-type]
                tuple(_joined_column(item["table"], c) for c in columns),
                kind.lower() if isinstance(kind, str) else kind)  # type: ignore[arg-type]


def _joined_column(table: object, item: object) -> JoinedColumn:
    if isinstance(item, JoinedColumn):
        return item
    if isinstance(item, str) and item:
        return JoinedColumn(item, item)
    if isinstance(item, Mapping) and set(item) == {"name", "column"} and all(
            isinstance(item[k], str) and item[k] for k in ("name", "column")):
        return JoinedColumn(item["name"], item["column"])
    raise InvalidJoin(
        f"join of {table!r}: column item {item!r} must be a dimension column name or a "
        "mapping {name: <name in the MV>, column: <dimension column>}")


def joined_names(joins: Sequence[Join]) -> dict[str, str]:
    """Every joined column's name in the MV -> its type ("" until the dimension is read)."""
    return {c.name: "" for j in joins for c in j.columns}


def join_problems(joins: Sequence[Join], upstream: str, fact: Mapping[str, str] | None,
                  pk: Sequence[object]) -> list[str]:
    """Why these joins cannot be maintained (empty: they can, as far as the definition
    says). ``fact``: the upstream's columns -> types (None: not read yet, so what needs
    them is left for later); ``pk``: the MV's primary-key columns (names or KeyColumns).
    Joined names read like upstream columns, so a computed column of the same name is
    refused by the row MV's own check."""
    out, seen = [], {c.lower(): "the upstream" for c in fact or {}}
    seen[VNODE] = "the platform's vnode column"
    for j in joins:
        out += _item_problems(j, upstream, fact)
        for c in j.columns:
            owner = seen.get(c.name.lower())
            if owner:
                out.append(
                    f"joined column {c.name!r} of {j.table!r} clashes with a column of {owner} "
                    f"(names are case-insensitive): bring it in under another name, "
                    f"{{name: {j.table}_{c.column}, column: {c.column}}}")
            seen[c.name.lower()] = f"the join of {j.table!r}"
    joined = {c.name for j in joins for c in j.columns}
    pk = [getattr(p, "name", p) for p in pk]
    if any(p in joined for p in pk):
        out.append(f"primary_key {pk} names joined columns: the MV is keyed by the "
                   "upstream's primary key (a lookup join keeps one row per upstream row)")
    return out


def _item_problems(j: Join, upstream: str, fact: Mapping[str, str] | None) -> list[str]:
    out, name = [], j.table
    if not isinstance(name, str) or not name:
        return [f"a join needs a table: the dimension's table or MV name (got {name!r})"]
    if name == upstream:
        out.append(f"join of {name!r} joins the upstream with itself: a lookup join reads a "
                   "dimension, another table")
    if j.kind not in KINDS:
        out.append(f"join of {name!r} has kind {j.kind!r}: use inner (the default) or left")
    if not j.key or not all(isinstance(k, str) and k for k in j.key) or len(set(j.key)) < len(
            j.key):
        out.append(f"join of {name!r}: key must list the dimension's declared key columns, "
                   f"each once (got {list(j.key)})")
    dims = [d for _, d in j.on]
    if sorted(dims) != sorted(j.key) or len(set(dims)) < len(dims):
        out.append(
            f"join of {name!r} joins on {dims}, which is not the dimension's declared key "
            f"{list(j.key)}: a lookup join matches each upstream row with at most one dimension "
            "row, so map an upstream column to every key column, each once (on: {<upstream "
            f"column>: {', '.join(map(str, j.key))}}})")
    unknown = [f for f, _ in j.on if fact is not None and f not in fact]
    if unknown:
        out.append(f"join of {name!r} reads unknown upstream columns {unknown}: pick from "
                   f"({', '.join(fact)}); a join key is an upstream column")
    return out


@dataclass(frozen=True)
class Dimension:
    """What the platform reads of a dimension table before the first write: its columns ->
    types, whether its change data feed is on, and the key it records (None: none recorded,
    e.g. a table no platform job created)."""

    name: str
    columns: Mapping[str, str]
    change_feed: bool
    recorded_key: tuple[str, ...] | None = None


def check_dimension(j: Join, dim: Dimension, fact: Mapping[str, str]) -> dict[str, str]:
    """Refuse a dimension that cannot serve ``j`` (raised before any write, when the table is
    read): no change feed (DimensionWithoutChangeFeed), unknown columns, a declared key that
    is not its recorded key, a key column that is no key type or whose type differs from the
    upstream column it joins. Returns the joined columns' names -> types."""
    if not dim.change_feed:
        raise DimensionWithoutChangeFeed(
            f"dimension {dim.name!r} has no change data feed, so its changes could never "
            "reach the MV; enable it (ALTER TABLE ... SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true)) and rerun")
    out, cols = [], dim.columns
    unknown = [c for c in (*j.key, *(c.column for c in j.columns)) if c not in cols]
    if unknown:
        out.append(f"dimension {dim.name!r} has no columns {unknown}: pick from "
                   f"({', '.join(c for c in cols if c != VNODE)})")
    if dim.recorded_key is not None and tuple(dim.recorded_key) != tuple(j.key):
        out.append(f"join of {dim.name!r} declares key {list(j.key)} but the table's key is "
                   f"{list(dim.recorded_key)}: declare that key and join on all of it")
    for fact_col, dim_col in j.on:
        if dim_col not in cols or fact_col not in fact:
            continue
        try:
            want = parse_key_type(cols[dim_col], dim_col)
        except InvalidKeyType as e:
            out.append(f"join of {dim.name!r}: {e}")
            continue
        if parse_key_type_or_none(fact[fact_col]) != want:
            out.append(f"join of {dim.name!r}: upstream column {fact_col!r} is {fact[fact_col]} "
                       f"but key column {dim_col!r} is {cols[dim_col]}: join columns of one "
                       "type (cast the upstream column in the upstream)")
    if out:
        raise InvalidJoin(f"join of {dim.name!r} cannot be kept: " + "; ".join(out))
    return {c.name: cols[c.column] for c in j.columns}


def parse_key_type_or_none(type_name: str) -> str | None:
    """The canonical key type of ``type_name``, or None when it is no key type."""
    try:
        return parse_key_type(type_name)
    except InvalidKeyType:
        return None


def refuse_unserved_joins(definition: object) -> None:
    """Refuse an MV with joins at a barrier (JoinMVNotServed): the join is defined and its
    algebra exists (docs/JOINS.md), but no step runs it yet, and a row MV's barrier would
    ignore the joins and write wrong rows."""
    joins = getattr(definition, "joins", ())
    if joins:
        raise JoinMVNotServed(
            f"MV {getattr(definition, 'name', '?')!r} joins {[j.table for j in joins]}: such "
            "definitions are checked but no barrier runs them yet (docs/JOINS.md); remove "
            "joins to serve it as a row MV, or keep it out of the platform until joins are "
            "served")


def join_sql(joins: Sequence[Join], fact: str, dimensions: Mapping[str, str],
             fact_columns: Sequence[str]) -> str:
    """The Spark SQL of the join the MV equals (before its filter, computed columns and
    aggregates): ``fact`` and each dimension's relation (a view or a table at a version,
    by dimension name) joined on the declared keys, the fact columns then every join's
    carried columns under their names. The oracle's recomputation (verify_job) reads it."""
    selected = ", ".join([*(f"f.{_quoted(c)}" for c in fact_columns),
                          *(f"d{i}.{_quoted(c.column)} AS {_quoted(c.name)}"
                            for i, j in enumerate(joins) for c in j.columns)])
    text = f"SELECT {selected} FROM {fact} f"
    for i, j in enumerate(joins):
        on = " AND ".join(f"f.{_quoted(f)} = d{i}.{_quoted(d)}" for f, d in j.on)
        text += f" {'LEFT ' if j.kind == 'left' else ''}JOIN {dimensions[j.table]} d{i} ON {on}"
    return text


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
