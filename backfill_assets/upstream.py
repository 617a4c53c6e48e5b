"""The platform's upstream table: create it, recover its spec, and write DML batches to it.

This module is the one name callers import (jobs, resources, the load generator, tests,
benchmarks); the work is split by purpose so each part reads on its own:
- upstream_spec.py: ``UpstreamSpec`` (columns, primary key, vnodes), ``create_upstream``,
  ``read_upstream_spec``;
- upstream_values.py: values checked against a spec before anything is written
  (``check_value``, ``conform_rows``);
- upstream_dml.py: ``apply_dml`` (one batch of inserts, updates, deletes, upserts and pk
  changes as exactly one Delta version), ``insert_rows`` (bulk append), ``existing_keys``,
  ``row_count``.
The upstream checks a backfill step makes before it writes are in upstream_check.py.
"""

from __future__ import annotations

from backfill_assets.upstream_dml import (
    DmlBatch,
    apply_dml,
    existing_keys,
    insert_rows,
    prepare_batch,
    row_count,
)
from backfill_assets.upstream_spec import (
    COLUMN_TYPES,
    PK_PROPERTY,
    VNODE_COLUMN,
    VNODE_COUNT_PROPERTY,
    UpstreamSpec,
    create_upstream,
    keys_of,
    read_upstream_spec,
)
from backfill_assets.upstream_values import check_value, conform_rows

__all__ = ["COLUMN_TYPES", "PK_PROPERTY", "VNODE_COLUMN", "VNODE_COUNT_PROPERTY", "DmlBatch",
           "UpstreamSpec", "apply_dml", "check_value", "conform_rows", "create_upstream",
           "existing_keys", "insert_rows", "keys_of", "prepare_batch", "read_upstream_spec",
           "row_count"]
