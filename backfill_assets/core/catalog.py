"""The catalog of MV definitions: many files in, healthy MVs in barrier order and broken ones out.

Why pure: a platform keeps tens of MVs, and one bad file must never take the others down. Every
decision (the name of each MV, a clash, a definition refused, lineage and its cycles) is made
here on data already read, so each is cheap to test exhaustively; resources/catalog.py only
reads the files and resolves table URIs.

A definition's name is its ``name:`` or, without one, its file's stem. Names are what Dagster
allows for a group and an asset-key prefix (letters, digits, ``_``), and unique ignoring case
(the MV's folder in the warehouse is its name, and some stores ignore case). Of two files
claiming one name, the file whose stem is that name keeps it (``orders.yaml`` owns
``orders``); with no such single owner, every claimant is refused.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from backfill_assets.core.errors import (
    BackfillError,
    InvalidMVDefinition,
    MVNameClash,
    UnknownMV,
)
from backfill_assets.core.lineage import Lineage, MVNode, build_lineage
from backfill_assets.core.mv_definition import MVDefinition

MV_NAME = re.compile(r"[A-Za-z0-9_]+")  # Dagster's rule for group names and key parts


@dataclass(frozen=True)
class Source:
    """One definition file as read: its parsed YAML, or why it could not be read."""

    path: str
    raw: object = None
    error: BackfillError | None = None

    @property
    def stem(self) -> str:
        return posixpath.splitext(posixpath.basename(self.path))[0]

    @property
    def claimed_name(self) -> str:
        """The ``name:`` it gives, if a non-empty string, else its stem."""
        raw = self.raw
        name = raw.get("name") if isinstance(raw, Mapping) else None
        return name if isinstance(name, str) and name else self.stem


@dataclass(frozen=True)
class BrokenMV:
    """A definition the catalog refused: shown beside the healthy MVs, never run."""

    name: str  # the name it claims (its name: or its file's stem)
    source: str  # the file
    error: BackfillError  # raise it to refuse a run of this MV by name

    @property
    def message(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@dataclass(frozen=True)
class Catalog:
    """The healthy MVs (by name, in barrier order), the broken ones, and their lineage."""

    definitions: Mapping[str, MVDefinition]
    sources: Mapping[str, str]  # healthy MV -> its file
    upstreams: Mapping[str, str]  # healthy MV -> its upstream table's URI, resolved
    broken: tuple[BrokenMV, ...]
    lineage: Lineage

    @property
    def names(self) -> tuple[str, ...]:
        """The healthy MVs in barrier order: each after the MVs it reads."""
        return self.lineage.order

    def definition(self, name: str) -> MVDefinition:
        """The healthy MV ``name``; a broken one raises its own error, an unknown one
        UnknownMV listing what the catalog holds."""
        if name in self.definitions:
            return self.definitions[name]
        for b in self.broken:
            if b.name == name:
                raise type(b.error)(f"MV {name!r} ({b.source}) is broken: {b.error}")
        raise UnknownMV(
            f"no MV named {name!r} in the catalog: its MVs are "
            f"{', '.join(self.names) or '(none)'}"
            + (f"; broken: {', '.join(b.name for b in self.broken)}" if self.broken else "")
        )


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name an MV, or None."""
    if isinstance(name, str) and MV_NAME.fullmatch(name):
        return None
    return (f"the MV name {name!r} is not allowed: use letters, digits and _ only (it names "
            "the MV's asset group, its asset keys and its folder in the warehouse)")


def assemble(sources: Sequence[Source], defaults: Mapping[str, object],
             node_of: Callable[[MVDefinition], MVNode],
             output_of: Callable[[str], str]) -> Catalog:
    """The catalog of ``sources``: each parsed with ``defaults`` under its own fields, name
    clashes and lineage refusals turned into broken MVs. ``node_of`` gives an MV's tables as
    resolved URIs; ``output_of`` the output URI an MV of that name would have."""
    parsed: list[tuple[Source, MVDefinition]] = []
    broken: list[BrokenMV] = []
    for s in sorted(sources, key=lambda s: s.path):
        result = _parse(s, defaults)
        if isinstance(result, BrokenMV):
            broken.append(result)
        else:
            parsed.append((s, result))
    healthy, clashed = _settle_names(parsed)
    broken += clashed
    nodes = {d.name: node_of(d) for _, d in healthy}
    broken_outputs = {output_of(b.name): b.name for b in broken
                      if name_problem(b.name) is None and b.name not in nodes}
    lineage = build_lineage(nodes.values(), broken_outputs)
    files = {d.name: s.path for s, d in healthy}
    broken += [BrokenMV(n, files[n], e) for n, e in lineage.refused.items()]
    by_name = {d.name: d for _, d in healthy}
    return Catalog(
        definitions={n: by_name[n] for n in lineage.order},
        sources={n: files[n] for n in lineage.order},
        upstreams={n: nodes[n].reads[0] for n in lineage.order},
        broken=tuple(sorted(broken, key=lambda b: (b.name, b.source))),
        lineage=lineage,
    )


def _parse(source: Source, defaults: Mapping[str, object]) -> MVDefinition | BrokenMV:
    """The definition of one file, or the file as a broken MV with the reason."""
    name = source.claimed_name
    if source.error is not None:
        return BrokenMV(name, source.path, source.error)
    raw = source.raw
    if not isinstance(raw, Mapping):
        return BrokenMV(name, source.path, InvalidMVDefinition(
            f"{source.path} holds {type(raw).__name__ if raw is not None else 'nothing'}, not "
            "an MV definition: write a YAML mapping with upstream, primary_key and columns"))
    problem = name_problem(raw.get("name", source.stem))
    if problem:
        where = "its name: field" if "name" in raw else "its file name (or add a name: field)"
        return BrokenMV(name, source.path, InvalidMVDefinition(
            f"{source.path}: {problem}; change {where}"))
    try:
        return MVDefinition.from_dict({**defaults, "name": source.stem, **raw}).check_controls()
    except BackfillError as exc:
        return BrokenMV(name, source.path, exc)
    except (TypeError, ValueError) as exc:  # a value of a shape from_dict never expected
        return BrokenMV(name, source.path, InvalidMVDefinition(
            f"{source.path}: the definition cannot be read ({exc}): check each field against "
            "jobs/configs/mv.yaml"))


def _settle_names(parsed: list[tuple[Source, MVDefinition]],
                  ) -> tuple[list[tuple[Source, MVDefinition]], list[BrokenMV]]:
    """Keep one definition per name (ignoring case): the single file whose stem is the
    name, else none; refuse the other claimants, naming the files involved."""
    groups: dict[str, list[tuple[Source, MVDefinition]]] = {}
    for s, d in parsed:
        groups.setdefault(d.name.lower(), []).append((s, d))
    healthy, broken = [], []
    for group in groups.values():
        if len(group) == 1:
            healthy += group
            continue
        owners = [(s, d) for s, d in group if s.stem == d.name]
        keep = owners[0] if len(owners) == 1 else None
        files = ", ".join(s.path for s, _ in group)
        for s, d in group:
            if (s, d) == keep:
                healthy.append((s, d))
                continue
            why = (f"the name belongs to {keep[0].path} (its file is named after it)" if keep
                   else "no single one of them is named after its file")
            broken.append(BrokenMV(d.name, s.path, MVNameClash(
                f"MV name {d.name!r} is claimed by {files} (names ignore case): {why}; give "
                f"{s.path} another name: field or file name")))
    return healthy, broken
