"""One MV definition, from a YAML file (BACKFILL_MV_CONFIG) or the default: a catalog of one.
(A folder of definitions, BACKFILL_MV_DIR, is read by resources/catalog.py.)

The default is the demo MV over the platform's own upstream table (`jobs/configs/mv.yaml`).
"""

from __future__ import annotations

import yaml

from backfill_assets.core.errors import InvalidMVDefinition, UnknownMV
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from resources.settings import (  # noqa: F401 (DEFAULT_MV_CONFIG: re-exported)
    DEFAULT_MV_CONFIG,
    ENV_MV_CONFIG,
    ENV_MV_DIR,
    Settings,
    load_settings,
)


def load_mv_definition(settings: Settings | None = None, path: str | None = None) -> MVDefinition:
    """Read and structurally check the MV definition (the upstream is checked at run time)."""
    settings = settings or load_settings()
    if path is None and settings.mv_dir is not None:
        return _only_mv_of_folder(settings)
    path = path or settings.mv_config or DEFAULT_MV_CONFIG
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except OSError as exc:
        raise InvalidMVDefinition(
            f"cannot read the MV definition {path}: {exc.strerror}; set BACKFILL_MV_CONFIG to "
            "a readable YAML file"
        ) from exc
    raw.setdefault("vnode_count", settings.vnode_count)
    raw.setdefault("chunk_size", settings.chunk_size)
    return MVDefinition.from_dict(raw)


def mv_tables(d: MVDefinition, settings: Settings | None = None,
              storage_options: dict[str, str] | None = None) -> MVTables:
    settings = settings or load_settings()
    if storage_options is None:  # outside a run (sensor, scripts): resolve them here
        storage_options = settings.storage_options()
    return MVTables.under(settings.warehouse_root, d.name, d.upstream, storage_options)


def _only_mv_of_folder(settings: Settings) -> MVDefinition:
    """The one MV of a folder catalog, for a caller that serves one MV (scripts, benchmarks);
    a folder of several names none of them, so it is refused rather than guessed."""
    from resources.catalog import load_catalog  # the catalog reads files through this module

    catalog = load_catalog(settings)
    if len(catalog.names) == 1 and not catalog.broken:
        return catalog.definitions[catalog.names[0]]
    raise UnknownMV(
        f"{ENV_MV_DIR}={settings.mv_dir} holds {len(catalog.names)} healthy MVs "
        f"({', '.join(catalog.names) or 'none'}) and {len(catalog.broken)} broken: this caller "
        f"serves one MV; set {ENV_MV_CONFIG} to its file instead, or use "
        "resources.catalog.load_catalog")
