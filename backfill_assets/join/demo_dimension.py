"""The demo's dimension: a `customers` table keyed by `customer` (the demo upstream's `name`,
"n0" .. "n99999"), written with the platform's writer, so the demo's join MV
(jobs/configs/mvs/revenue_by_segment.yaml) has a dimension that moves: segments change,
customers leave and come back, and customers the first load left out arrive late (their
orders' left-joined rows are padded with nulls until then)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.join.sources import dimension_uri
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.upstream.writer import DmlBatch, UpstreamSpec, apply_dml, create_upstream

COLUMNS = {"customer": "string", "segment": "string", "country": "string"}
SEGMENTS = ("consumer", "smb", "enterprise", "public")
COUNTRIES = ("fr", "de", "us", "jp", "br")
LATE_EVERY = 10  # the first load leaves out every 10th customer: they arrive late


def customers_spec(vnode_count: int = 256) -> UpstreamSpec:
    return UpstreamSpec("customers", dict(COLUMNS), ("customer",), vnode_count,
                        description="the demo's customers dimension (docs/JOINS.md)")


def _row(rng: random.Random, k: int) -> dict:
    return {"customer": f"n{k}", "segment": rng.choice(SEGMENTS),
            "country": rng.choice(COUNTRIES)}


def write_customers(uri: str, *, customers: int = 100_000, changes: int = 0, seed: int = 0,
                    storage_options: Mapping[str, str] | None = None) -> int:
    """Create the dimension when missing (every customer but the late ones), then apply one
    batch of ``changes`` random changes: segment updates, deletes, and inserts of customers
    not held (late ones, or ones deleted before). Returns the table's version."""
    so = dict(storage_options or {})
    spec = customers_spec()
    rng = random.Random(seed)
    if owned_tables.open_if_exists(uri, so) is None:
        create_upstream(uri, spec, so or None)
        rows = [_row(rng, k) for k in range(customers) if k % LATE_EVERY]
        return apply_dml(uri, DmlBatch(inserts=rows), spec=spec, storage_options=so or None)
    held = set(owned_tables.read_rows(owned_tables.open_if_exists(uri, so), None,
                                      ["customer"]).column("customer").to_pylist())
    live = sorted(held)
    absent = [f"n{k}" for k in rng.sample(range(customers), min(customers, changes * 4))
              if f"n{k}" not in held]
    rng.shuffle(live)
    updates, deletes = [], []
    for _ in range(changes):
        kind = rng.choice(("update", "update", "delete", "insert"))
        if kind == "insert" and absent:
            updates.append(_row(rng, int(absent.pop()[1:])))  # an upsert of a key not held
        elif live:
            key = live.pop()
            if kind == "delete":
                deletes.append((key,))
            else:
                updates.append(_row(rng, int(key[1:])))
    inserts = [r for r in updates if r["customer"] not in held]
    updates = [r for r in updates if r["customer"] in held]
    return apply_dml(uri, DmlBatch(inserts=inserts, updates=updates, deletes=deletes),
                     spec=spec, storage_options=so or None)


def demo_customers(mvs: Iterable[tuple[MVDefinition, MVTables]]) -> str | None:
    """The `customers` dimension a join MV of ``mvs`` reads, created with its first rows
    (every customer but the late ones), or None when no MV joins it: what the demo's writer
    then changes beside the upstream."""
    for d, tables in mvs:
        if any(j.table == "customers" for j in d.joins):
            uri = dimension_uri(tables, "customers")
            write_customers(uri, storage_options=dict(tables.storage_options))
            print("the customers dimension: every customer but the late ones (every 10th)")
            return uri
    return None


__all__ = ["customers_spec", "demo_customers", "write_customers"]
