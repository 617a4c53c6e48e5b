"""A folder catalog's assets: each MV's group, the shared upstream tables, the broken MVs.

Each healthy MV gets what one MV has (wiring/assets.py, wiring/checks.py) under keys prefixed
by its name (`MVAssets`); the tables MVs read that no MV writes become one external asset each,
keyed by the table (`external_asset_paths`) and shared by every MV reading it; an MV reading
another MV's output depends on that MV's `downstream_mv`, so the lineage draws MV -> MV. A
broken MV becomes one non-materializable asset in a group of its own whose description and
metadata carry its error: the code location loads and the UI says what to fix.
"""

from __future__ import annotations

import dagster as dg

from backfill_assets.core.catalog import Catalog
from backfill_assets.core.lineage import external_asset_paths, table_key
from backfill_assets.step.request import Hook
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.checks import build_oracle_check, build_progress_check
from backfill_assets.wiring.keys import MV_NAME, Served, broken_key, in_folder
from resources.settings import Settings

UPSTREAMS_GROUP = "upstream_tables"  # the external tables MVs read


def serve_folder(catalog: Catalog, settings: Settings) -> tuple[Served, list[dg.AssetSpec]]:
    """Every healthy MV's keys, and the external asset of each table MVs read."""
    lineage = catalog.lineage
    paths = external_asset_paths(lineage.external, settings.warehouse_root)
    keys = {}
    for name in catalog.names:
        reads = [dg.AssetKey(list(paths[t])) for t in lineage.upstream_tables[name] if t in paths]
        reads += [dg.AssetKey([u, MV_NAME]) for u in lineage.reads[name]]
        keys[name] = in_folder(name, tuple(reads))
    uri = {table_key(u): u for u in catalog.upstreams.values()}  # as the definitions say it
    specs = [dg.AssetSpec(
        dg.AssetKey(list(path)), group_name=UPSTREAMS_GROUP,
        description=f"Upstream Delta table {uri.get(table, table)}: written outside the "
                    "platform (upstream_load_job or another engine) and read by MVs "
                    f"{', '.join(lineage.external[table])}; not materialized here.",
        metadata={"table": dg.MetadataValue.path(uri.get(table, table)),
                  "read_by": dg.MetadataValue.text(", ".join(lineage.external[table]))})
        for table, path in paths.items()]
    return Served(catalog, keys, folder=True), specs


def folder_assets(srv: Served, settings: Settings, hook: Hook | None = None
                  ) -> tuple[list, list]:
    """(assets, asset checks) of every healthy MV of the catalog and of every broken one."""
    assets: list = []
    checks: list = []
    for name in srv.names:
        d, k = srv.pick(name)
        assets += build_assets(d, settings, hook=hook, keys=k)
        checks += [build_oracle_check(d, settings, k), build_progress_check(d, settings, k)]
    return assets + broken_specs(srv), checks


def broken_specs(srv: Served) -> list[dg.AssetSpec]:
    """One asset per broken MV, carrying its error, in a group of its own."""
    taken = {n.lower() for n in srv.names} | {UPSTREAMS_GROUP}
    out = []
    for b in srv.catalog.broken if srv.catalog else ():
        stem = b.source.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        group = broken_key(b.name, stem, taken)
        out.append(dg.AssetSpec(
            dg.AssetKey([group, MV_NAME]), group_name=group,
            description=f"BROKEN: MV {b.name!r} ({b.source}) is not served: {b.message}",
            metadata={"broken": dg.MetadataValue.text(b.message),
                      "definition_file": dg.MetadataValue.path(b.source)},
            kinds={"broken"}))
    return out
