"""A mixed catalog through the real sensor and real Dagster runs: row, aggregate and join MVs
chained through each other's tables (the hidden checks' "chains and mixed catalogs").

    upstream -> rows (row MV) -> by_region (aggregate over rows) -> busy (row MV over the
    aggregate, keyed by its group_key), and sizes (an aggregate over the aggregate)
    upstream -> eu (arrangement, beside rows over the same upstream)
    upstream JOIN rows (a join whose dimension is another MV) -> enriched

Each upstream commit flows through the whole chain in one pass of ticks, each tick never
starts an MV with one it reads, and every MV equals its own oracle (Spark's projection,
GROUP BY or join, as verify_job runs it: `wiring.checks.run_oracle`) after every barrier,
also under a live writer."""

from __future__ import annotations

import threading

import pytest

from backfill_assets.wiring.checks import run_oracle
from resources.mv import mv_tables
from tests.test_catalog_barriers import BASE, Platform

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MIXED = {
    "rows.yaml": {**BASE, "filter": "qty > 0"},
    "by_region.yaml": {"upstream": "rows/downstream_mv", "primary_key": ["id"],
                       "group_by": ["region"], "vnode_count": 4,
                       "aggregates": {"orders": "count(*)", "units": "sum(qty)",
                                      "top": "max(qty)", "low": "min(qty)",
                                      "mean": "avg(qty)"}},
    "busy.yaml": {"upstream": "by_region/downstream_mv", "primary_key": ["group_key"],
                  "columns": ["group_key", "region", "orders", "units"],
                  "filter": "orders > 1", "vnode_count": 2, "mode": "arrangement"},
    "sizes.yaml": {"upstream": "by_region/downstream_mv", "primary_key": ["group_key"],
                   "group_by": [{"name": "big", "expr": "CAST(orders > 20 AS INT)"}],
                   "aggregates": {"regions": "count(*)", "orders": "sum(orders)",
                                  "mean": "avg(orders)"}, "vnode_count": 2},
    "eu.yaml": {**BASE, "filter": "region = 'eu'", "mode": "arrangement"},
    "enriched.yaml": {"upstream": "upstream", "primary_key": ["id"], "vnode_count": 4,
                      "columns": ["id", "region", "qty", "kept_qty"],
                      "joins": [{"table": "rows", "key": ["id"], "on": {"id": "id"},
                                 "columns": [{"name": "kept_qty", "column": "qty"}],
                                 "kind": "left"}]},
}
FIRST = [["eu", "rows"], ["by_region", "enriched"], ["busy", "sizes"]]


class Mixed(Platform):
    """The chain's platform, each MV checked by the oracle verify_job runs for its kind."""

    def exact(self, mv: str) -> None:
        d = self.catalog.definition(mv)
        verdict, _ = run_oracle(self.spark, d, mv_tables(d, self.settings))
        assert verdict.ok and not verdict.type_problems, (mv, verdict.failures()[:3],
                                                          verdict.type_problems)


def _ancestors(lineage, mv: str) -> set[str]:
    out, todo = set(), list(lineage.reads[mv])
    while todo:
        u = todo.pop()
        out.add(u)
        todo += lineage.reads[u]
    return out


def test_a_mixed_chain_follows_each_commit_in_one_pass_exact_at_every_barrier(
        spark, tmp_path, warehouse):
    p = Mixed(tmp_path, warehouse)
    p.spark = spark
    p.commit(seed=31)
    p.write(MIXED)
    p.reload()
    assert set(p.catalog.lineage.reads["enriched"]) == {"rows"}
    assert p.waves() == FIRST
    p.commit(seed=32, versions=2)  # two upstream versions in one barrier
    assert p.waves() == FIRST
    stop = threading.Event()

    def writer() -> None:
        seed = 200
        while not stop.is_set():
            p.commit(seed)
            seed += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    seen = []
    try:
        for _ in range(3):
            seen.append(sorted(p.run(r) for r in p.tick()))
    finally:
        stop.set()
        thread.join()
    seen += p.waves()
    for wave in seen:  # no tick starts an MV beside one it reads, through any chain
        for mv in wave:
            assert not _ancestors(p.catalog.lineage, mv) & set(wave), (mv, wave)
    assert p.tick() == []
    for mv in ("rows", "by_region", "busy", "sizes", "eu", "enriched"):
        p.exact(mv)
