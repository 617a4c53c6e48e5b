"""Fault-injection harness: real backfills in child processes, killed at commit boundaries.

What it gives the reliability tests:

- `Chain`: one MV over a pre-written upstream (seeded DML, one Delta version per batch) with a
  pinned barrier script, so two chains over the same upstream see exactly the same barriers and
  must end with exactly the same tables. The reference chain runs in-process; the crash chain
  runs the barrier under test in a child process that SIGKILLs itself at a kill point.
- children (children.py): `dagster job execute ... -j backfill_job` (the real wiring:
  definitions from the environment, `BACKFILL_TEST_KILL_AT`, run config `barrier_version`,
  partition range tags) and a light child (`python -m tests.reliability.children '<json>'`)
  that calls `run_barrier` with `testing.kill_hook.kill_hook` and, for the concurrency tests, a file
  rendezvous that holds both runs at a point until both reached it.
- `snapshot` / `assert_same_tables` (checks.py): MV rows (multiset of all columns), progress
  rows, Delta versions, duplicate keys.
- `verify_recovered` (checks.py): the invariant (docs/DESIGN.md) on the *recoverable*
  state (the progress table completed by the MV commit a crash left without its progress
  commit), plus the replica invariant (replicated_state of an unfinished vnode == upstream at
  its recorded version). Unlike `oracle.verify` it holds after *every* commit, also between
  the MV and progress commits.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.reliability.checks import (
    Check,
    TableState,
    assert_oracle,
    assert_recovered_invariant,
    assert_same_tables,
    recovered_progress,
    run_verify_job,
    snapshot,
    table_versions,
    verify_recovered,
)
from tests.reliability.checks import _open as _open
from tests.reliability.children import (
    ChildResult,
    child_env,
    dagster_backfill,
    finish,
    init_dagster_home,
    light_args,
    light_backfill,
    light_command,
    start_light,
    write_mv_config,
)

# the tests use this module as the one façade (``H``) of checks.py and children.py too
__all__ = ["ROOT", "VNODES", "Barrier", "Chain", "Check", "ChildResult", "Counter", "TableState",
           "_open", "assert_oracle", "assert_recovered_invariant", "assert_same_tables",
           "child_env", "dagster_backfill", "definition", "finish", "init_dagster_home",
           "latest", "light_args", "light_backfill", "light_command", "mv_raw", "orders",
           "prewrite", "recovered_progress", "run_verify_job", "snapshot", "start_light",
           "table_versions", "tables_of", "verify_recovered", "vnode_ranges",
           "write_mv_config"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

VNODES = 8


# ------------------------------------------------------------------------------ definitions


def mv_raw(name: str, mode: str, chunk_size: int, upstream: str, vnode_count: int = VNODES,
           **extra) -> dict:
    """The MV the suite uses (the e2e tests' MV: a filter, two computed columns)."""
    return {"name": name, "upstream": upstream, "primary_key": ["id"],
            "columns": ["id", "name", "amount", "qty"], "filter": "qty > 2",
            "computed": [{"name": "amount_x_qty", "expr": "amount * qty"},
                         {"name": "name_upper", "expr": "upper(name)"}],
            "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count, **extra}


def definition(raw: dict):
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict(raw)


def tables_of(warehouse: str, raw: dict, storage_options: dict | None = None):
    from backfill_assets.mv.owned_tables import MVTables

    return MVTables.under(warehouse, raw["name"], raw["upstream"], storage_options)


def orders(warehouse: str, seed: int, vnode_count: int = VNODES, name: str = "orders",
           storage_options: dict | None = None):
    """A seeded LiveUpstream of the e2e tests' `orders` table (not created yet); the
    warehouse may be an object-store URI reached with ``storage_options``."""
    from tests.support import LiveUpstream, simple_row, simple_spec

    return LiveUpstream(f"{warehouse}/{name}", simple_spec(vnode_count, name),
                        random.Random(seed), simple_row, lambda rng: rng.randint(1, 100_000),
                        storage_options=storage_options)


def prewrite(live, rows: int, batches: int, changes: int) -> list[int]:
    """Create the upstream, load `rows`, then `batches` DML versions; the versions written."""
    live.create(rows)
    versions = [latest(live.uri, live.storage_options)]
    for _ in range(batches):
        versions.append(live.apply(live.random_batch(changes)))
    return versions


def latest(uri: str, storage_options: dict | None = None) -> int:
    from deltalake import DeltaTable

    return DeltaTable(uri, storage_options=storage_options or None).version()


# ---------------------------------------------------------------------------------- chains


@dataclass
class Barrier:
    """One barrier of a script: a pinned upstream version over some vnodes."""

    version: int
    vnodes: tuple[int, ...] = tuple(range(VNODES))
    chunk_size: int | None = None
    rate_limit: int | None = None


@dataclass
class Chain:
    """One MV driven through a barrier script; remembers the state after every barrier."""

    spark: object
    warehouse: str
    raw: dict
    states: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    storage_options: dict | None = None  # an object-store warehouse's options

    @property
    def d(self):
        return definition(self.raw)

    @property
    def tables(self):
        return tables_of(self.warehouse, self.raw, self.storage_options)

    def run(self, b: Barrier, hook=None):
        from backfill_assets.barrier.runner import run_barrier
        from backfill_assets.mv.controls import Controls

        report = run_barrier(self.spark, self.d, self.tables, list(b.vnodes), version=b.version,
                             overrides=Controls(b.chunk_size, b.rate_limit),
                             **({"hook": hook} if hook else {}))
        self.reports.append(report)
        self.states.append(snapshot(self.tables))
        return report


def vnode_ranges(rng: random.Random, vnodes: Iterable[int], max_ranges: int = 4) -> list[list]:
    """A random split of `vnodes` into contiguous ranges (a rescale)."""
    ordered = sorted(vnodes)
    cuts = sorted(rng.sample(range(1, len(ordered)), k=rng.randint(0, min(max_ranges - 1,
                                                                        len(ordered) - 1))))
    bounds = [0, *cuts, len(ordered)]
    return [ordered[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < b]
