"""The declarative MV definition and its structural validation.

Why structural validation here: every mistake a user can make in the definition (unknown
column, pk not selected, a clash, a bad control) must be refused with a message that says
what to do *before* anything is written; checking it in the pure core makes the checks
cheap and exhaustively testable. Whether the filter and computed expressions parse is
Spark's business and is checked by the Spark adapter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.core import aggregate_definition as agg
from backfill_assets.core import join_definition as jd
from backfill_assets.core.codec import RESERVED_COLUMNS
from backfill_assets.core.definition_items import (
    UNRESOLVED,
    ComputedColumn,
    as_list,
    computed_changes,
    computed_item,
    pk_column,
)
from backfill_assets.core.errors import BackfillError, InvalidJoin, InvalidMVDefinition
from backfill_assets.core.keys import KeyColumn, KeyOrder, parse_key_type
from backfill_assets.core.names import VNODE, name_problems
from backfill_assets.core.progress import is_count
from backfill_assets.core.snapshot import CATCH_UP_STEP_ROWS, DEFAULT_SLICE_ROWS
from backfill_assets.core.sql_calls import row_expression_problems
from backfill_assets.core.vnode import MAX_VNODE_COUNT

MODE_NAMES = ("snapshot", "arrangement", "no_shuffle")  # the first is the default
# continuous mode in a folder: share one follower run with the others, or have its own
FOLLOWER_NAMES = ("pool", "own")  # the first is the default
_FIELDS = ("name", "upstream", "primary_key", "columns", "filter", "computed", "mode",
           "chunk_size", "rate_limit", "vnode_count", "slice_rows", "catch_up_rows",
           "group_by", "aggregates", "joins", "follower")
_REQUIRED = ("name", "upstream", "primary_key", "columns")  # an aggregate MV has no columns


@dataclass(frozen=True)
class MVDefinition:
    """What the MV is: upstream, pk, selected and computed columns, filter, controls."""

    name: str
    upstream: str
    primary_key: tuple[KeyColumn, ...]
    columns: tuple[str, ...]
    filter: str | None = None
    computed: tuple[ComputedColumn, ...] = ()
    mode: str = MODE_NAMES[0]
    chunk_size: int = 10000
    rate_limit: int | None = None
    vnode_count: int = 256
    slice_rows: int = DEFAULT_SLICE_ROWS  # snapshot mode: estimated rows per slice commit
    catch_up_rows: int = CATCH_UP_STEP_ROWS  # snapshot mode: change rows per catch-up step
    group_by: tuple[agg.GroupColumn, ...] = ()  # an aggregate MV (docs/AGGREGATES.md)
    aggregates: tuple[agg.Aggregate, ...] = ()
    joins: tuple[jd.Join, ...] = ()  # lookup joins with dimensions (docs/JOINS.md)
    follower: str = FOLLOWER_NAMES[0]  # how it is served, not what it is: not fingerprinted

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> MVDefinition:
        """Build from plain data (YAML/JSON). pk items are names or dicts with name, type,
        descending, nulls_first; a missing type is resolved later from the upstream."""
        if not isinstance(d, Mapping):
            raise InvalidMVDefinition(f"an MV definition must be a mapping, got {d!r}")
        unknown = sorted(set(d) - set(_FIELDS))
        aggregate = bool(d.get("aggregates") or d.get("group_by"))  # empty ones: a row MV
        missing = [f for f in _REQUIRED if f not in d and not (aggregate and f == "columns")]
        if unknown or missing:
            raise InvalidMVDefinition(
                f"MV definition {d.get('name', '?')!r}: "
                + (f"unknown fields {unknown} " if unknown else "")
                + (f"missing fields {missing} " if missing else "")
                + f"(allowed fields: {', '.join(_FIELDS)})"
            )
        fields = dict(d)
        pk = as_list(d["primary_key"], "primary_key")
        fields["primary_key"] = tuple(pk_column(p) for p in pk)
        fields["columns"] = tuple(as_list(d.get("columns", ()), "columns"))
        if aggregate:
            fields["group_by"] = agg.parse_group_by(d.get("group_by", ()))
            fields["aggregates"] = agg.parse_aggregates(d.get("aggregates", ()))
        if "joins" in d:
            fields["joins"] = jd.parse_joins(d["joins"])
        computed = as_list(d.get("computed", ()), "computed")
        fields["computed"] = tuple(computed_item(c) for c in computed)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def key_order(self) -> KeyOrder:
        """The pk order (raises InvalidKeyType while a pk type is unresolved)."""
        return KeyOrder(self.primary_key)

    @property
    def is_aggregate(self) -> bool:
        """An aggregate MV: its rows are groups, keyed by `group_by` (docs/AGGREGATES.md)."""
        return bool(self.group_by or self.aggregates)

    @property
    def output_columns(self) -> tuple[str, ...]:
        """Selected columns, computed columns, then the vnode column (always added); for an
        aggregate MV the group columns, the aggregates, then the vnode column."""
        if self.is_aggregate:
            return (*(g.name for g in self.group_by), *(a.name for a in self.aggregates),
                    VNODE)
        return (*self.columns, *(c.name for c in self.computed), VNODE)

    def recorded(self) -> dict[str, object]:
        """What the MV's rows depend on, as plain data recorded with its state: the upstream,
        the pk and its order, the selected and computed columns, the filter and the mode
        (controls such as chunk size and rate limit are not part of it). A row MV's form has
        no aggregate keys, so its fingerprint is the one it always had."""
        out: dict[str, object] = {
            "upstream": self.upstream,
            "primary_key": [[c.name, c.descending, c.nulls_first] for c in self.primary_key],
            "columns": list(self.columns),
            "computed": [[c.name, c.expr] for c in self.computed],
            "filter": self.filter,
            "mode": self.mode,
        }
        if self.is_aggregate:
            out["group_by"] = [[g.name, g.expr] for g in self.group_by]
            out["aggregates"] = [[a.name, a.text] for a in self.aggregates]
        if self.joins:  # an MV without joins keeps the fingerprint it always had
            out["joins"] = [j.recorded() for j in self.joins]
        return out

    @property
    def fingerprint(self) -> str:
        """A short stable hash of `recorded()`."""
        text = json.dumps(self.recorded(), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def changes_since(self, recorded: Mapping[str, object]) -> list[str]:
        """What differs between this definition and one recorded earlier (empty: the same)."""
        now = self.recorded()
        out = []
        for key in now:
            before, after = recorded.get(key), now[key]
            if key == "columns":
                added = [c for c in after if c not in (before or [])]  # type: ignore[union-attr]
                dropped = [c for c in (before or []) if c not in after]  # type: ignore[union-attr]
                if added:
                    out.append(f"output columns {added} added")
                if dropped:
                    out.append(f"output columns {dropped} removed")
                if not added and not dropped and before != after:
                    out.append(f"output columns reordered from {before} to {after}")
            elif key == "computed" and before != after:
                out += computed_changes(dict(before or []), dict(after))  # type: ignore[arg-type]
            elif before != after:
                out.append(f"{key} changed from {before!r} to {after!r}")
        return out

    def validate(self, upstream_columns: Mapping[str, str],
                 joined: Mapping[str, str] | None = None) -> MVDefinition:
        """Refuse a structurally wrong definition (listing every problem and its fix);
        return it with pk types resolved from ``upstream_columns``. Joined columns read like
        upstream ones (``joined``: their types, `join_definition.check_dimension`)."""
        available = {**upstream_columns, **jd.joined_names(self.joins), **(joined or {})}
        problems = self._control_problems() + (
            self._aggregate_problems(available) if self.is_aggregate
            else self._column_problems(available))
        joins = jd.join_problems(self.joins, self.upstream, upstream_columns, self.primary_key)
        added = [*(c.name for c in self.computed), *(g.name for g in self.group_by),
                 *(a.name for a in self.aggregates), *jd.joined_names(self.joins)]
        problems += name_problems(upstream_columns, [c for c in added if isinstance(c, str)])
        resolved, type_problems = self._resolve_pk(upstream_columns)
        self._refuse(joins + problems + type_problems, InvalidJoin if joins else None)
        return dataclasses.replace(self, primary_key=resolved)

    def check_controls(self) -> MVDefinition:
        """Refuse what is wrong without the upstream's schema (name, upstream, mode, controls,
        filter, joins): a catalog of MVs refuses such a definition when it loads, not at its
        first run. Returns the definition unchanged."""
        joins = jd.join_problems(self.joins, self.upstream, None, self.primary_key)
        self._refuse(joins + self._control_problems(), InvalidJoin if joins else None)
        return self

    def _refuse(self, problems: list[str], error: type[InvalidMVDefinition] | None = None
                ) -> None:
        if problems:
            raise (error or InvalidMVDefinition)(
                f"MV definition {self.name!r} is invalid: " + "; ".join(problems)
            )

    def _control_problems(self) -> list[str]:
        out = []
        for field in ("name", "upstream"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                out.append(f"{field} must be a non-empty string")
        if self.mode not in MODE_NAMES:
            out.append(f"mode {self.mode!r} is not one of {', '.join(MODE_NAMES)}")
        if self.follower not in FOLLOWER_NAMES:
            out.append(f"follower {self.follower!r} is not one of {', '.join(FOLLOWER_NAMES)}")
        if not is_count(self.chunk_size) or self.chunk_size < 1:
            out.append(f"chunk_size {self.chunk_size!r} must be an int >= 1")
        for field in ("slice_rows", "catch_up_rows"):
            if not is_count(getattr(self, field)) or getattr(self, field) < 1:
                out.append(f"{field} {getattr(self, field)!r} must be an int >= 1")
        if not is_count(self.vnode_count) or not 1 <= self.vnode_count <= MAX_VNODE_COUNT:
            out.append(f"vnode_count {self.vnode_count!r} must be an int in 1..{MAX_VNODE_COUNT}")
        if self.rate_limit is not None and not is_count(self.rate_limit):
            out.append(
                f"rate_limit {self.rate_limit!r} must be empty (unlimited), 0 (paused) or a "
                "positive int of rows per second"
            )
        f = self.filter
        if f is not None and (not isinstance(f, str) or not f.strip()):
            out.append("filter must be a non-empty Spark SQL expression or absent")
        return out

    def _column_problems(self, upstream: Mapping[str, str]) -> list[str]:
        out = []
        available = ", ".join(upstream)
        bad = [c for c in self.columns if not isinstance(c, str) or not c]
        if bad or not self.columns:
            out.append(
                f"columns must be a non-empty list of column names (got {list(self.columns)})"
            )
        if VNODE in self.columns:
            out.append(
                f"{VNODE!r} is computed by the platform for every MV row (an upstream "
                f"column of that name is not carried): remove it from columns"
            )
        unknown = [c for c in self.columns
                   if c not in upstream and c not in bad and c != VNODE]
        if unknown:
            out.append(f"unknown columns {unknown}: pick from the upstream's columns ({available})")
        pk_names = [c.name for c in self.primary_key]
        if not pk_names:
            out.append("primary_key is empty: list the upstream's primary-key columns")
        unknown_pk = [n for n in pk_names if n not in upstream]
        if unknown_pk:
            out.append(f"unknown primary-key columns {unknown_pk}: pick from ({available})")
        unselected = [n for n in pk_names if n not in self.columns and n not in unknown_pk]
        if unselected:
            out.append(
                f"primary-key columns {unselected} are not output columns: add them to columns"
            )
        reserved = [n for n in pk_names if n.lower() in RESERVED_COLUMNS]
        if reserved:
            out.append(
                f"primary-key columns {reserved} clash with the progress table's columns "
                f"{sorted(RESERVED_COLUMNS)}: choose another primary key"
            )
        lowered = [c.lower() for c in self.output_columns if isinstance(c, str)]
        dupes = sorted({c for c in lowered if lowered.count(c) > 1})
        if dupes:
            out.append(
                f"output column names {dupes} appear more than once (names are "
                f"case-insensitive; {VNODE!r} is always added): rename them"
            )
        upstream_lower = {u.lower() for u in upstream}
        for c in self.computed:
            if not isinstance(c.name, str) or not c.name:
                out.append("a computed column needs a non-empty name")
            elif c.name.lower() in upstream_lower:
                out.append(
                    f"computed column {c.name!r} has the name of an upstream column: rename it"
                )
            if not isinstance(c.expr, str) or not c.expr.strip():
                out.append(f"computed column {c.name!r} needs a non-empty Spark SQL expression")
        return out

    def _aggregate_problems(self, upstream: Mapping[str, str]) -> list[str]:
        """The row MV's checks that still apply (pk, computed columns, output names), then
        the aggregate's own (`aggregate_definition.definition_problems`)."""
        out = [p for p in self._column_problems(upstream)
               if not p.startswith("columns must") and "are not output columns" not in p]
        if self.columns:
            out.append("an aggregate MV's output is its group_by and aggregates: remove columns")
        if not self.group_by or not self.aggregates:
            out.append("an aggregate MV needs both group_by and aggregates")
        available = {**upstream, **{c.name: "" for c in self.computed}}
        out += agg.kept_input_key_problems([c.name for c in self.primary_key],
                                           self.aggregates, available)
        return out + agg.definition_problems(self.group_by, self.aggregates, available) + [
            p for c in self.computed
            for p in row_expression_problems(c.expr, f"computed column {c.name!r}")] + (
            row_expression_problems(self.filter, "filter") if isinstance(self.filter, str) else [])

    def _resolve_pk(self, upstream: Mapping[str, str]) -> tuple[tuple[KeyColumn, ...], list[str]]:
        resolved, out = [], []
        for c in self.primary_key:
            t = c.type
            try:
                if c.name in upstream:
                    have = parse_key_type(upstream[c.name], c.name)
                    if t != UNRESOLVED and parse_key_type(t, c.name) != have:
                        out.append(
                            f"primary-key column {c.name!r} is declared {t} but the upstream has "
                            f"{upstream[c.name]}: declare the upstream's type or omit it"
                        )
                    t = have
                elif t != UNRESOLVED:
                    t = parse_key_type(t, c.name)
            except BackfillError as e:
                out.append(str(e))
            resolved.append(dataclasses.replace(c, type=t))
        return tuple(resolved), out
