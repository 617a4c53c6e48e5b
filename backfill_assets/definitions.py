"""Dagster definitions (wiring only): assets, jobs, the barrier sensor and resources.

Loading this module never starts a JVM (the Spark resource is lazy) and never touches a table.
The default executor is in-process, so a vnode range materialized from the asset pages runs
the same single-process barrier as backfill_job, with the same resources.
"""

from __future__ import annotations

import dagster as dg

from backfill_assets.storage import key_cache
from backfill_assets.testing.kill_hook import kill_hook
from backfill_assets.wiring import named_errors
from backfill_assets.wiring.assets import build_assets
from backfill_assets.wiring.checks import build_oracle_check, build_progress_check
from backfill_assets.wiring.partitions import vnode_partitions
from backfill_assets.wiring.sensors import build_barrier_sensor
from jobs.backfill import build_backfill_job
from jobs.controls import build_controls_job
from jobs.follower import build_follower_jobs
from jobs.maintain import build_maintain_job
from jobs.reset import build_reset_job
from jobs.resnapshot import build_resnapshot_job
from jobs.upstream_load import upstream_load_job
from jobs.verify import build_verify_job
from resources.mv import load_mv_definition
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

named_errors.install()  # `dagster job execute` and friends: a named error first
settings = load_settings()
named_errors.install(settings.traceback)
key_cache.set_limit(settings.key_cache_mib << 20)  # each run process keeps its own
mv = load_mv_definition(settings)
backfill_job = build_backfill_job(vnode_partitions(mv.vnode_count), mv.name)

defs = dg.Definitions(
    assets=build_assets(mv, settings, hook=kill_hook(settings.test_kill_at)),
    asset_checks=[build_oracle_check(mv, settings), build_progress_check(mv, settings)],
    jobs=[upstream_load_job, backfill_job, build_verify_job(mv, settings),
          build_controls_job(mv, settings), build_maintain_job(mv, settings),
          build_reset_job(mv, settings), build_resnapshot_job(mv, settings),
          *build_follower_jobs(mv, settings, hook=kill_hook(settings.test_kill_at))],
    sensors=[build_barrier_sensor(mv, settings, "backfill_job", settings.run_ranges)],
    executor=dg.in_process_executor,
    resources={
        "spark": spark_resource(settings),
        "warehouse": warehouse_resource(settings),
    },
)
