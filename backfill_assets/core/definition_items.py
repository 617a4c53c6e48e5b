"""The items of an MV definition, parsed one by one: a primary-key column, a computed column.

Why apart from ``mv_definition``: these are the definition's vocabulary (what one list item
may look like, and how two computed lists differ), each refusing a malformed item by name;
``MVDefinition`` composes them and validates the whole against the upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.core.errors import InvalidMVDefinition
from backfill_assets.core.keys import KeyColumn

UNRESOLVED = ""  # KeyColumn.type of a pk column whose type comes from the upstream schema
_PK_FIELDS = ("name", "type", "descending", "nulls_first")


@dataclass(frozen=True)
class ComputedColumn:
    """An output column computed by a Spark SQL expression over the upstream row."""

    name: str
    expr: str


def computed_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What a changed ``computed`` list changed, in words, for a refused resnapshot."""
    out = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(f"computed column {name!r} removed")
        elif name not in old:
            out.append(f"computed column {name!r} added ({new[name]!r})")
        elif old[name] != new[name]:
            out.append(f"computed column {name!r} changed from {old[name]!r} to {new[name]!r}")
    return out or ["computed columns reordered"]


def as_list(value: object, field: str) -> list:
    """A field written as one name or a list of them, as a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise InvalidMVDefinition(f"{field} must be a list, got {value!r}")


def pk_column(item: object) -> KeyColumn:
    """A primary-key item: a bare name (its type from the upstream) or a mapping."""
    if isinstance(item, KeyColumn):
        return item
    if isinstance(item, str):
        return KeyColumn(item, UNRESOLVED)
    flags = ("descending", "nulls_first")
    if (
        isinstance(item, Mapping)
        and "name" in item
        and not set(item) - set(_PK_FIELDS)
        and all(isinstance(item.get(f, False), bool) for f in flags)
    ):
        return KeyColumn(
            item["name"],  # type: ignore[arg-type]
            item.get("type") or UNRESOLVED,  # type: ignore[arg-type]
            item.get("descending", False),  # type: ignore[arg-type]
            item.get("nulls_first", False),  # type: ignore[arg-type]
        )
    raise InvalidMVDefinition(
        f"primary_key item {item!r} must be a column name or a mapping with keys "
        f"{', '.join(_PK_FIELDS)} (name required; descending and nulls_first are booleans)"
    )


def computed_item(item: object) -> ComputedColumn:
    """A computed item: exactly a name and a Spark SQL expression."""
    if isinstance(item, ComputedColumn):
        return item
    if isinstance(item, Mapping) and set(item) == {"name", "expr"}:
        return ComputedColumn(item["name"], item["expr"])  # type: ignore[arg-type]
    raise InvalidMVDefinition(
        f"computed item {item!r} must be a mapping with exactly the keys name and expr"
    )
