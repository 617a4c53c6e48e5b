"""The warehouse resource: where the platform's Delta tables live and how to reach them."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from backfill_assets.storage import table_uri
from resources.settings import Settings, load_settings


class WarehouseResource(dg.ConfigurableResource):
    """Root of every table the platform owns, plus object-store options.

    ``root`` is a local folder (the embedded default, ``./warehouse``) or an object-store URI
    (``s3://bucket/prefix``, ``az://...``, ``gs://...``). ``storage_options`` are handed to
    deltalake as they are (``aws_access_key_id``, ``aws_endpoint_url``, ...): give secret values
    as ``dagster.EnvVar("NAME")`` so they are read from the environment at run time and never
    stored in config or run records (BACKFILL_STORAGE_OPTIONS wires that from settings).
    """

    root: str = Field(description="Local folder or object-store URI holding all tables.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="deltalake storage options; use EnvVar for secrets.",
    )

    def table_uri(self, name: str) -> str:
        """URI of the table ``name`` (a name under root, or an absolute path/URI as is)."""
        return table_uri(self.root, name)

    def options(self) -> dict[str, str] | None:
        """Storage options for deltalake calls (None when empty: local files)."""
        return dict(self.storage_options) or None


def warehouse_resource(settings: Settings | None = None) -> WarehouseResource:
    settings = settings or load_settings()
    return WarehouseResource(
        root=settings.warehouse_root,
        storage_options={k: dg.EnvVar(v) for k, v in settings.storage_options_env.items()},
    )
