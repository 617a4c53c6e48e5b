"""Dagster definitions (wiring only): assets, jobs, the barrier sensor and resources.

Loading this module never starts a JVM (the Spark resource is lazy) and never touches a table.
The default executor is in-process, so a vnode range materialized from the asset pages runs
the same single-process barrier as backfill_job, with the same resources.

`BACKFILL_MV_CONFIG` (or the demo's default file) serves one MV under today's keys;
`BACKFILL_MV_DIR` serves a folder catalog: each MV a group of its own with prefixed keys, the
shared upstream tables, broken MVs shown with their error, one sensor for all in lineage
order, and jobs that take the MV by config or tag (docs/CATALOG.md).
"""

from __future__ import annotations

import dagster as dg

from backfill_assets.storage import key_cache
from backfill_assets.testing.kill_hook import kill_hook
from backfill_assets.wiring import named_errors
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.catalog_assets import folder_assets, serve_folder
from backfill_assets.wiring.catalog_sensor import build_catalog_sensor
from backfill_assets.wiring.checks import build_oracle_check, build_progress_check
from backfill_assets.wiring.keys import Served
from backfill_assets.wiring.partitions import vnode_partitions
from backfill_assets.wiring.sensors import build_barrier_sensor
from jobs.backfill import build_backfill_job, build_catalog_backfill_job
from jobs.controls import build_controls_job
from jobs.follower import build_follower_jobs
from jobs.maintain import build_maintain_job
from jobs.reset import build_reset_job
from jobs.resnapshot import build_resnapshot_job
from jobs.upstream_load import upstream_load_job
from jobs.verify import build_verify_job
from resources.catalog import load_catalog
from resources.mv import load_mv_definition
from resources.settings import Settings, load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

named_errors.install()  # `dagster job execute` and friends: a named error first
settings = load_settings()
named_errors.install(settings.traceback)
key_cache.set_limit(settings.key_cache_mib << 20)  # each run process keeps its own


def _shared_jobs(srv: Served, s: Settings, hook) -> list:
    """The jobs that take the MV by config or tag (the only MV of a catalog of one)."""
    return [upstream_load_job, build_verify_job(srv, s), build_controls_job(srv, s),
            build_maintain_job(srv, s), build_reset_job(srv, s), build_resnapshot_job(srv, s),
            *build_follower_jobs(srv, s, hook=hook)]


def build_definitions(s: Settings) -> dg.Definitions:
    """The code location for settings `s`: one MV under today's keys (a file), or a folder
    catalog (`BACKFILL_MV_DIR`)."""
    hook = kill_hook(s.test_kill_at)
    if s.mv_dir is None:  # a catalog of one: today's keys, names and jobs
        mv = load_mv_definition(s)
        served = Served.of_one(mv)
        assets = build_assets(mv, s, hook=hook)
        checks = [build_oracle_check(mv, s), build_progress_check(mv, s)]
        backfill_job = build_backfill_job(vnode_partitions(mv.vnode_count), mv.name)
        sensor = build_barrier_sensor(mv, s, "backfill_job", s.run_ranges)
    else:  # a folder: one group per MV, one sensor for all, jobs by MV
        served, upstreams = serve_folder(load_catalog(s), s)
        assets, checks = folder_assets(served, s, hook=hook)
        assets = upstreams + assets
        backfill_job = build_catalog_backfill_job(served, s, hook=hook)
        sensor = build_catalog_sensor(served, s, s.run_ranges)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[backfill_job, *_shared_jobs(served, s, hook)],
        sensors=[sensor],
        executor=dg.in_process_executor,
        resources={
            "spark": spark_resource(s),
            "warehouse": warehouse_resource(s),
        },
    )


defs = build_definitions(settings)
# the MV of a catalog of one (jobs/demo.py names it); a folder catalog has many (None)
mv = load_mv_definition(settings) if settings.mv_dir is None else None
