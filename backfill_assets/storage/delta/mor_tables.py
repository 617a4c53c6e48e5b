"""The tables the platform owns (MV, replica): merge-on-read Delta tables, not partitioned.

Created through delta-rs (version 0), then upgraded by one log entry of our own (version 1) to
reader 3 / writer 7 with the ``deletionVectors`` feature and ``delta.enableDeletionVectors=true``
(measured: delta-rs' ``alter.add_feature`` followed by ``set_table_properties`` also switches on
the ``variantType`` reader feature, which older readers refuse, and drops ``changeDataFeed``
from the writer features). Rows
carry a ``vnode`` column; the physical layout (files clustered by vnode and key) is the
writer's business, so there are no 256 partition folders of tiny files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from backfill_assets.storage.delta.log import commit_uri
from backfill_assets.storage.store import conditional, objects

DV_PROPERTY = "delta.enableDeletionVectors"
CDF_PROPERTY = "delta.enableChangeDataFeed"


def open_mor_table(uri: str, storage_options: Mapping[str, str] | None) -> DeltaTable | None:
    try:
        return DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return None


def ensure_mor_table(uri: str, schema: pa.Schema, storage_options: Mapping[str, str] | None,
                     *, cdf: bool, description: str | None = None,
                     configuration: Mapping[str, str] | None = None) -> DeltaTable:
    """Open the table, creating it (empty, DVs on) when missing; safe against a racing
    creator: the loser uses the winner's table."""
    opts = dict(storage_options or {}) or None
    conditional.check_conditional_writes(uri, storage_options)  # before the first write
    table = open_mor_table(uri, storage_options)
    if table is None:
        config = {CDF_PROPERTY: "true" if cdf else "false", **dict(configuration or {})}
        try:
            # no retries: a create that lost the race must not become a second metadata commit
            DeltaTable.create(uri, schema, mode="ignore", configuration=config,
                              description=description, raise_if_key_not_exists=False,
                              commit_properties=CommitProperties(max_commit_retries=0),
                              storage_options=opts)
        except CommitFailedError:
            pass
        table = DeltaTable(uri, storage_options=opts)
    if "deletionVectors" not in (table.protocol().reader_features or []):
        _enable_deletion_vectors(uri, storage_options)  # a racing creator may have done it
        table = DeltaTable(uri, storage_options=opts)
    return table


def _enable_deletion_vectors(uri: str, storage_options: Mapping[str, str] | None) -> None:
    """Version 1: the protocol with DVs and the configuration with DVs enabled."""
    raw = objects.read_bytes(commit_uri(uri, 0), storage_options).decode()
    metadata = next(json.loads(line)["metaData"] for line in raw.splitlines()
                    if line.strip() and "metaData" in json.loads(line))
    created = next((json.loads(line)["protocol"] for line in raw.splitlines()
                    if line.strip() and "protocol" in json.loads(line)), {})
    metadata["configuration"] = {**metadata.get("configuration", {}), DV_PROPERTY: "true"}
    writer = ["appendOnly", "invariants", "deletionVectors"]
    if metadata["configuration"].get(CDF_PROPERTY) == "true":
        writer.append("changeDataFeed")
    # keep what the schema needed at creation (timestampNtz for a timestamp without time zone)
    reader = ["deletionVectors", *(f for f in created.get("readerFeatures") or []
                                   if f != "deletionVectors")]
    writer += [f for f in created.get("writerFeatures") or [] if f not in writer]
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "ADD FEATURE",
                        "operationParameters": {"name": "deletionVectors"},
                        "engineInfo": "backfill-assets storage layer"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": reader, "writerFeatures": writer}},
        {"metaData": metadata},
    ]
    payload = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    objects.put_if_absent(commit_uri(uri, 1), payload.encode(), storage_options)
