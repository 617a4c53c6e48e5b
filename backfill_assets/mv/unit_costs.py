"""What this MV's barriers measured: seconds per change row applied and per vnode row
re-snapshotted (core/cost_choice.py's `UnitCosts`), kept in `unit_costs.json` beside the MV's
tables.

Why a document beside the tables (through `storage.store.documents`, like the controls): every run,
follower and machine that runs a barrier of this MV reads and refines the same figures, on a
local folder or an object store; they describe this MV's data and this deployment's engine,
so a reset keeps them, as it keeps the controls. A write replaces the document whole; two runs
over disjoint vnode ranges that finish at the same moment may each write their own sample
over the other's: one sample is lost, which a smoothed figure can afford (no lock needed).
"""

from __future__ import annotations

from backfill_assets.core.cost_choice import UnitCosts
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.storage import objects, read_json, write_json


def unit_costs_uri(tables: MVTables) -> str:
    return objects.join(tables.root, "unit_costs.json")


def read_unit_costs(tables: MVTables) -> UnitCosts:
    """The costs measured so far (the defaults before the first sample, or for a document that
    is not one the platform wrote)."""
    try:
        doc = read_json(unit_costs_uri(tables), tables.storage_options)
    except ValueError:  # not JSON: start again from the defaults rather than fail a barrier
        doc = None
    return UnitCosts.from_json(doc if isinstance(doc, dict) else None)


def record_cost(tables: MVTables, path: str, rows: int, seconds: float) -> UnitCosts:
    """Fold one barrier's cost on `path` (APPLY or RESNAPSHOT) into the document; returns the
    costs now kept (unchanged, and nothing written, for a barrier too small to say)."""
    before = read_unit_costs(tables)
    after = before.observed(path, rows, seconds)
    if after != before:
        write_json(unit_costs_uri(tables), after.to_json(), tables.storage_options)
    return after
