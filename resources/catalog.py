"""The catalog of MVs the platform serves, read from files.

A folder of definitions (``BACKFILL_MV_DIR``: every ``*.yaml`` / ``*.yml`` directly in it,
hidden files skipped) or one file (``BACKFILL_MV_CONFIG``, or the demo's
``jobs/configs/mv.yaml`` when neither is set: a catalog of one). Each file is read on its own,
so a file that cannot be read or parsed becomes a broken MV with its error and the rest load;
what is decided about names, clashes and lineage is in backfill_assets/core/catalog.py.

``python -m resources.catalog [folder]`` checks a catalog before it is deployed: the MVs in
barrier order, what each reads, and every broken MV with its error (exit status 1 if any).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import yaml

from backfill_assets.core.catalog import Catalog, Source, assemble
from backfill_assets.core.errors import InvalidMVDefinition, InvalidSettings
from backfill_assets.core.join_definition import tables_read
from backfill_assets.core.lineage import MVNode
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from resources.settings import (
    DEFAULT_MV_CONFIG,
    ENV_MV_CONFIG,
    ENV_MV_DIR,
    Settings,
    load_settings,
)

SUFFIXES = (".yaml", ".yml")


def load_catalog(settings: Settings | None = None) -> Catalog:
    """Every MV definition the settings name, each healthy or broken; raise InvalidSettings
    only when the folder itself cannot be listed (then no MV can be known)."""
    settings = settings or load_settings()
    if settings.mv_dir is not None:
        paths = definition_files(settings.mv_dir)
    else:
        paths = [settings.mv_config or DEFAULT_MV_CONFIG]
    return catalog_of([read_source(p) for p in paths], settings)


def catalog_of(sources: list[Source], settings: Settings) -> Catalog:
    """The catalog of already read ``sources``, with the settings' defaults and tables."""
    defaults = {"vnode_count": settings.vnode_count, "chunk_size": settings.chunk_size}
    root = settings.warehouse_root.rstrip("/")
    mv_names = {s.claimed_name for s in sources if s.error is None}

    def output_of(name: str) -> str:
        return MVTables.under(root, name, name).mv

    def dimension_of(name: str) -> str:
        # as join/sources.dimension_uri finds it at run time, but from the catalog's names,
        # so lineage holds before the other MV's output is first written
        if "://" in name or name.startswith("/"):
            return name
        return output_of(name) if name in mv_names else f"{root}/{name}"

    def node_of(d: MVDefinition) -> MVNode:
        t = MVTables.under(root, d.name, d.upstream)
        dimensions = tuple(dimension_of(n) for n in tables_read(d)[1:])
        reads = tuple(dict.fromkeys((t.upstream, *dimensions)))
        return MVNode(d.name, reads, t.mv, (t.progress, t.replica))

    return assemble(sources, defaults, node_of, output_of)


def definition_files(folder: str) -> list[str]:
    """The definition files directly in ``folder``, by name."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise InvalidSettings(
            f"{ENV_MV_DIR}={folder!r} cannot be listed ({exc.strerror}): point it at a folder "
            f"of MV definitions (*.yaml), or unset it and use {ENV_MV_CONFIG} for one file"
        ) from None
    # a dangling link or an unreadable file is listed, so it shows as broken, not absent
    return [os.path.join(folder, n) for n in names
            if n.endswith(SUFFIXES) and not n.startswith(".")
            and not os.path.isdir(os.path.join(folder, n))]


def read_source(path: str) -> Source:
    """One file's parsed YAML, or why it cannot be read (never raises)."""
    try:
        with open(path, encoding="utf-8") as f:
            return Source(path, yaml.safe_load(f))
    except OSError as exc:
        return Source(path, error=InvalidMVDefinition(
            f"cannot read the MV definition {path}: {exc.strerror}; make it a readable YAML "
            "file"))
    except UnicodeDecodeError:
        return Source(path, error=InvalidMVDefinition(
            f"the MV definition {path} is not UTF-8 text: save it as UTF-8 YAML"))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        return Source(path, error=InvalidMVDefinition(
            f"the MV definition {path} is not valid YAML{at} "
            f"({getattr(exc, 'problem', None) or exc}): fix the file"))


def describe(catalog: Catalog) -> str:
    """The catalog as a reader checks it: each wave of MVs in barrier order with what each
    reads, then each broken MV with its file and error."""
    lines = []
    lineage = catalog.lineage
    for i, wave in enumerate(lineage.waves()):
        for name in wave:
            reads = ", ".join(f"MV {u}" for u in lineage.reads[name]) or catalog.upstreams[name]
            lines.append(f"wave {i}: {name} ({catalog.definitions[name].mode}) reads {reads}")
            for b in lineage.reads_broken.get(name, ()):
                lines.append(f"  reads the output of broken MV {b} as it last was")
    for b in catalog.broken:
        lines.append(f"broken: {b.name} ({b.source}): {b.message}")
    return "\n".join(lines or ["no MV definitions"])


def main(argv: list[str] | None = None) -> int:
    """Print the catalog the settings name (or the folder given); 1 if any MV is broken."""
    args = sys.argv[1:] if argv is None else argv
    settings = load_settings()
    if args:
        settings = dataclasses.replace(settings, mv_dir=os.path.abspath(args[0]), mv_config=None)
    catalog = load_catalog(settings)
    print(describe(catalog))
    return 1 if catalog.broken else 0


if __name__ == "__main__":
    sys.exit(main())
