"""A join MV in a folder catalog, for real (Spark, delta-rs, Dagster runs): the sensor asks for
a barrier when only its dimension moved, and the MV is exact against Spark's own join and
GROUP BY after it."""

from __future__ import annotations

from backfill_assets.join.demo_dimension import write_customers
from backfill_assets.verify.join_oracle import verify_join
from backfill_assets.wiring.checks import run_oracle
from resources.mv import mv_tables
from tests.test_catalog_barriers import VNODES, Platform

JOINED = {"upstream": "upstream", "primary_key": ["id"], "vnode_count": VNODES,
          "joins": [{"table": "customers", "key": ["customer"], "on": {"name": "customer"},
                     "columns": ["segment", "country"], "kind": "left"}],
          "filter": "qty > 0", "group_by": ["segment", "country"],
          "aggregates": {"revenue": "sum(amount)", "orders": "count(*)"}}


class JoinPlatform(Platform):
    def exact(self, mv: str) -> None:
        d = self.catalog.definition(mv)
        verdict = verify_join(self.spark, d, mv_tables(d, self.settings))
        assert verdict.ok, (mv, verdict.pair, verdict.missing, verdict.extra)
        # verify_job's and the check's path (wiring/checks.run_oracle) reaches the same oracle
        reported, meta = run_oracle(self.spark, d, mv_tables(d, self.settings))
        assert reported.ok and reported.rows_compared == verdict.rows_compared > 0
        assert meta["vnodes_failed"].value == 0


def test_a_dimension_only_commit_makes_the_sensor_request_a_barrier(spark, tmp_path,
                                                                      warehouse):
    p = JoinPlatform(tmp_path, warehouse)
    p.spark = spark
    p.commit(seed=21)
    customers = f"{warehouse}/customers"
    write_customers(customers, customers=500)
    p.write({"j.yaml": JOINED})
    p.reload()
    assert {mv for wave in p.waves() for mv in wave} == {"j"}
    assert p.tick() == []  # both sides at the pair it holds: nothing due
    write_customers(customers, customers=500, changes=40, seed=3)  # the dimension only
    requests = p.tick()
    assert requests and {r.tags["backfill/mv"] for r in requests} == {"j"}
    for r in requests:
        p.run(r)  # exact after it: segments moved without any order changing
    assert p.tick() == []
