"""The MV definition the platform serves, from a YAML file (BACKFILL_MV_CONFIG) or the default.

The default is the demo MV over the platform's own upstream table (`jobs/configs/mv.yaml`).
"""

from __future__ import annotations

import os

import yaml

from backfill_assets.core.errors import InvalidMVDefinition, InvalidSettings
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from resources.settings import ENV_MV_CONFIG, ENV_MV_DIR, Settings, load_settings

DEFAULT_MV_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs", "configs",
                                 "mv.yaml")


def load_mv_definition(settings: Settings | None = None, path: str | None = None) -> MVDefinition:
    """Read and structurally check the MV definition (the upstream is checked at run time)."""
    settings = settings or load_settings()
    if path is None and settings.mv_dir is not None:
        # the code location serves one MV (the catalog is not wired in: docs/CATALOG.md);
        # a folder silently ignored would serve the demo's MV instead of the user's
        raise InvalidSettings(
            f"{ENV_MV_DIR} names a catalog of MVs, which this code location does not serve "
            f"yet: unset it and set {ENV_MV_CONFIG} to the one definition to serve"
        )
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
