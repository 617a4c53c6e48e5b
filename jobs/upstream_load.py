"""upstream_load_job: make a live upstream table (create if missing, bulk load, DML versions).

    dagster job execute -m backfill_assets.definitions -j upstream_load_job \\
        -c jobs/configs/upstream_load.yaml

Deterministic per seed (same table state + same config -> same versions). No Spark: delta-rs
writes everything, so the job starts in seconds.
"""

import dagster as dg
from pydantic import Field

from backfill_assets.upstream.writer import OPS, LoadParams, run_load
from backfill_assets.wiring.named_errors import named_first
from resources.settings import load_settings
from resources.warehouse import WarehouseResource

DEFAULT_MIX = {"insert": 0.4, "update": 0.35, "delete": 0.15, "pk_change": 0.1, "upsert": 0.0}


class UpstreamLoadConfig(dg.Config):
    table: str = Field(default="upstream",
                       description="Table name under the warehouse root (or an absolute URI).")
    seed: int = Field(default=0, description="Seed: the same seed writes the same changes.")
    initial_rows: int = Field(default=10_000, ge=0,
                              description="Rows bulk-loaded when the table is created.")
    versions: int = Field(default=10, ge=0, description="DML versions to write.")
    changes_per_version: int = Field(default=100, ge=1, description="Changes in each version.")
    mix: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_MIX),
        description=f"Relative weights of the change kinds: {', '.join(OPS)}.")
    rate: float | None = Field(default=None, gt=0,
                               description="Versions per second (unset: as fast as possible).")
    vnode_count: int | None = Field(
        default=None, ge=1, le=32768,
        description="Vnodes of a new table (unset: BACKFILL_VNODE_COUNT, default 256).")
    composite_key: bool = Field(default=False,
                                description="Key (region, id) instead of (id) for a new table.")


@dg.op(description="Create the upstream table if missing, then write DML versions to it.")
@named_first
def upstream_load(context: dg.OpExecutionContext, config: UpstreamLoadConfig,
                  warehouse: WarehouseResource) -> dict:
    unknown = [k for k in config.mix if k not in OPS]
    if unknown:
        raise dg.Failure(f"unknown change kind(s) in mix: {unknown}; use {', '.join(OPS)}")
    uri = warehouse.table_uri(config.table)
    params = LoadParams(seed=config.seed, initial_rows=config.initial_rows,
                        versions=config.versions, changes_per_version=config.changes_per_version,
                        mix=config.mix, rate=config.rate)
    summary = run_load(
        uri, params, name=config.table,
        vnode_count=config.vnode_count or load_settings().vnode_count,
        composite_key=config.composite_key, storage_options=warehouse.options(),
        log=context.log.info,
    )
    context.log.info(
        f"{uri}: versions {summary.first_version}..{summary.last_version} "
        f"({summary.versions_written} written), {summary.row_count} rows, {summary.seconds}s"
    )
    context.add_output_metadata({
        "table_uri": summary.table_uri,
        "created": summary.created,
        "first_version": summary.first_version,
        "last_version": summary.last_version,
        "versions_written": summary.versions_written,
        "rows_initial": summary.rows_initial,
        "row_count": summary.row_count,
        "changes": dg.MetadataValue.json(summary.changes),
        "seconds": summary.seconds,
    })
    return {"table_uri": summary.table_uri, "last_version": summary.last_version,
            "row_count": summary.row_count, "versions_written": summary.versions_written}


@dg.job(description="Make a live upstream: create it if missing, bulk load, then DML versions "
                    "(inserts, updates, deletes, pk changes, upserts) at an optional rate.")
def upstream_load_job():
    upstream_load()
