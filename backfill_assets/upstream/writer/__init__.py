"""The platform's own upstream writer: create the table, recover its spec, write DML batches.

Not on the runtime path of a backfill (a backfill reads any upstream through
``upstream.layout`` and the storage layer); jobs, the load generator, tests and benchmarks
import this one name. The parts:
- ``upstream.spec``: ``UpstreamSpec`` (columns, primary key, vnodes), ``create_upstream``,
  ``read_upstream_spec``;
- ``upstream.values``: values checked against a spec before anything is written
  (``check_value``, ``conform_rows``);
- ``writer.dml``: ``apply_dml`` (one batch of inserts, updates, deletes, upserts and pk
  changes as exactly one Delta version), ``insert_rows`` (bulk append), ``existing_keys``,
  ``row_count``; ``writer.load_generator``: the deterministic load behind upstream_load_job.
The checks a backfill step makes before it writes are in ``step.preflight``."""

from __future__ import annotations

from backfill_assets.upstream.spec import (
    COLUMN_TYPES,
    PK_PROPERTY,
    VNODE,
    VNODE_COUNT_PROPERTY,
    UpstreamSpec,
    create_upstream,
    keys_of,
    read_upstream_spec,
)
from backfill_assets.upstream.values import check_value, conform_rows
from backfill_assets.upstream.writer.dml import (
    DmlBatch,
    apply_dml,
    existing_keys,
    insert_rows,
    prepare_batch,
    row_count,
)
from backfill_assets.upstream.writer.load_generator import OPS, LoadParams, run_load

__all__ = ["COLUMN_TYPES", "OPS", "PK_PROPERTY", "VNODE", "VNODE_COUNT_PROPERTY", "DmlBatch",
           "LoadParams", "run_load",
           "UpstreamSpec", "apply_dml", "check_value", "conform_rows", "create_upstream",
           "existing_keys", "insert_rows", "keys_of", "prepare_batch", "read_upstream_spec",
           "row_count"]
