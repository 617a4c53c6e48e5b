"""The asset keys and names of each MV the code location serves, and which MV a job runs.

Why one object: a catalog of one (`BACKFILL_MV_CONFIG`, or the demo's default) keeps exactly the
keys it always had (`downstream_mv`, `backfill_progress`, `replicated_state`, `upstream_table`,
group `backfill`): Dagster keys its event history by asset key, so renaming them would orphan
an existing deployment's history. A folder (`BACKFILL_MV_DIR`) prefixes every MV's keys with
its name (`orders/downstream_mv`, group `orders`) and reads its upstream as an external asset
shared per table (docs/CATALOG.md). `MVAssets` carries those differences, so no module has an
`if prefixed` branch of its own; `Served` resolves the MV a job run names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import dagster as dg
from pydantic import Field

from backfill_assets.core.catalog import Catalog
from backfill_assets.core.errors import UnknownMV
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.wiring.liveness import MV_TAG

UPSTREAM_NAME, REPLICA_NAME = "upstream_table", "replicated_state"
MV_NAME, PROGRESS_NAME = "downstream_mv", "backfill_progress"
SINGLE_GROUP = "backfill"
ALL = "all"  # the MV field's value for "every MV" where a job allows it
_KEY_PART = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class MVAssets:
    """One MV's asset keys, group, op names and the assets it reads."""

    name: str  # the MV's name
    prefix: tuple[str, ...] = ()  # () in a catalog of one, (name,) in a folder
    group: str = SINGLE_GROUP
    # the assets its barrier reads: `upstream_table` in a catalog of one; in a folder the
    # shared external asset of its upstream table, or the `downstream_mv` of the MV it reads
    reads: tuple[dg.AssetKey, ...] = (dg.AssetKey(UPSTREAM_NAME),)
    # a catalog of one declares `upstream_table` itself, partitioned like the MV
    owns_upstream: bool = True

    def key(self, part: str) -> dg.AssetKey:
        return dg.AssetKey([*self.prefix, part])

    @property
    def mv(self) -> dg.AssetKey:
        return self.key(MV_NAME)

    @property
    def progress(self) -> dg.AssetKey:
        return self.key(PROGRESS_NAME)

    @property
    def replica(self) -> dg.AssetKey:
        return self.key(REPLICA_NAME)

    @property
    def upstream(self) -> dg.AssetKey:
        return self.reads[0]

    @property
    def owned(self) -> tuple[str, ...]:
        """The user strings of the vnode-partitioned assets it writes (Dagster backfills of
        these hold its vnodes: wiring/liveness.py)."""
        return tuple(self.key(p).to_user_string() for p in (MV_NAME, PROGRESS_NAME, REPLICA_NAME))

    def op(self, name: str) -> str:
        """An op name unique in the code location (Dagster refuses two of one name)."""
        return "__".join([*self.prefix, name])

    @property
    def tag_filter(self) -> str | None:
        """The MV whose runs its liveness considers (None: every run, a catalog of one)."""
        return self.name if self.prefix else None


def single(d: MVDefinition) -> MVAssets:
    """The keys of a catalog of one: today's, unprefixed."""
    return MVAssets(d.name)


def in_folder(name: str, reads: tuple[dg.AssetKey, ...] = ()) -> MVAssets:
    """The keys of an MV of a folder catalog: prefixed by its name, in a group of its own."""
    return MVAssets(name, (name,), name, reads, owns_upstream=False)


def broken_key(name: str, stem: str, taken: set[str]) -> str:
    """The key prefix and group of a broken MV: the name it claims if Dagster allows it and no
    other MV holds it, else its file's stem reduced to letters, digits and `_`, told apart by
    a short hash while taken."""
    base = name if not _KEY_PART.search(name) and name else (_KEY_PART.sub("_", stem) or "_")
    out = base
    while out.lower() in taken:
        out = f"{base}_{hashlib.sha256((out + stem).encode()).hexdigest()[:6]}"
    taken.add(out.lower())
    return out


@dataclass(frozen=True)
class Served:
    """The MVs the code location serves and their keys; resolves the MV a run names."""

    catalog: Catalog | None  # None: one MV given by its definition (tests, scripts)
    keys: Mapping[str, MVAssets]
    folder: bool  # a folder catalog (prefixed keys, jobs need an MV named when it has many)
    definitions: Mapping[str, MVDefinition] = field(default_factory=dict)

    @classmethod
    def of_one(cls, d: MVDefinition) -> Served:
        """A catalog of one MV, from its definition (the single-file setting, tests)."""
        return cls(catalog=None, keys={d.name: single(d)}, folder=False,
                   definitions={d.name: d})

    @property
    def names(self) -> tuple[str, ...]:
        return self.catalog.names if self.catalog is not None else tuple(self.definitions)

    def definition(self, name: str) -> MVDefinition:
        if self.catalog is not None:
            return self.catalog.definition(name)
        if name in self.definitions:
            return self.definitions[name]
        raise UnknownMV(f"no MV named {name!r}: this code location serves "
                        f"{', '.join(self.names)}")

    def pick(self, name: str | None) -> tuple[MVDefinition, MVAssets]:
        """The MV a run names (its `mv` config or `backfill/mv` tag); unset: the only MV.
        A broken MV raises its own error; an unknown one, or none named among many,
        UnknownMV listing the names."""
        if not name:
            if not self.names:
                raise UnknownMV("this code location serves no healthy MV: add a definition "
                                "to the catalog's folder (or fix the broken ones) and reload")
            if len(self.names) != 1:
                raise UnknownMV(
                    "this code location serves several MVs: name one with the run config's "
                    f"`mv` field or the tag backfill/mv (one of {', '.join(self.names)})")
            name = self.names[0]
        d = self.definition(name)
        return d, self.keys[d.name]

    def picks(self, name: str | None) -> list[tuple[MVDefinition, MVAssets]]:
        """`pick`, or every healthy MV in barrier order for "all"."""
        if name == ALL:
            return [self.pick(n) for n in self.names]
        return [self.pick(name)]


def served(d: MVDefinition | Served) -> Served:
    """A job builder's argument as `Served`: one MV definition is a catalog of one."""
    return d if isinstance(d, Served) else Served.of_one(d)


class MVChoice(dg.Config):
    """The MV a job runs for: the launchpad's `mv` field."""

    mv: str | None = Field(
        default=None,
        description="The MV's name (unset: the run's tag backfill/mv, else the only MV of a "
                    "catalog of one); `all` runs it for every MV where the job allows it.")


def picked(context: dg.OpExecutionContext, srv: Served, mv: str | None,
           allow_all: bool = False) -> list[tuple[MVDefinition, MVAssets]]:
    """The MV(s) a job run is for, by its config or its `backfill/mv` tag; the run is tagged
    with it (run lists filter by it). "all" only where the job allows it."""
    name = mv or context.run.tags.get(MV_TAG)
    if name == ALL and not allow_all:
        raise UnknownMV(f"{context.job_name} runs for one MV at a time: name one of "
                        f"{', '.join(srv.names)} (not {ALL!r})")
    out = srv.picks(name)
    tag = ALL if name == ALL else out[0][0].name
    if context.run.tags.get(MV_TAG) != tag:
        context.instance.add_run_tags(context.run_id, {MV_TAG: tag})
    return out
