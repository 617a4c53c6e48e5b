"""Dagster definitions (wiring only): jobs and the platform resources built from settings.

Loading this module never starts a JVM (the Spark resource is lazy).
"""

from __future__ import annotations

import dagster as dg

from jobs.upstream_load import upstream_load_job
from resources.settings import load_settings
from resources.spark import spark_resource
from resources.warehouse import warehouse_resource

settings = load_settings()

defs = dg.Definitions(
    jobs=[upstream_load_job],
    resources={
        "spark": spark_resource(settings),
        "warehouse": warehouse_resource(settings),
    },
)
