"""The join benchmark's rows: an `orders` fact table, a `customers` dimension, the aggregate
over their join, and the DML every contender sees (benchmarks/bench_join.py).

orders (id bigint pk, customer bigint, amount decimal(12,2), qty int, day date): the aggregate
benchmark's rows (benchmarks/agg_data.py, `day` over `groups / 5` days) with `customer` spread
over the customers' keys. customers (cid bigint pk, region string, segment string): one row
per key 0..customers-1 but every LATE_EVERY-th (absent: their orders join nothing until
they are added). Both written by the platform's writer (change data feed on), cached
under BENCH_DATA per shape. The MV, as a user writes it in Spark SQL:

    SELECT c.region, o.day, sum(o.amount * o.qty) AS revenue, count(*) AS orders
    FROM orders o JOIN customers c ON o.customer = c.cid GROUP BY c.region, o.day

Changes (`Changes`, one deterministic sequence): a fact batch of n is 30% orders moved to
another customer (a join key change), 20% repriced, 20% deleted, 30% inserted; a dimension
batch of n is 60% customers moving region, 20% deleted (their orders leave the inner join),
20% added (a customer absent or deleted before arrives: its orders join).
"""

from __future__ import annotations

import decimal
import json
import os
import random
import shutil

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks import agg_data as A
from benchmarks.bench_data import DATA_DIR, LOAD_BATCH, dir_bytes, human_rows

MV_NAME = "revenue_by_region_day"
ORDERS = {"id": "bigint", "customer": "bigint", "amount": "decimal(12,2)", "qty": "int",
          "day": "date"}
CUSTOMERS = {"cid": "bigint", "region": "string", "segment": "string"}
REGIONS = ("north", "south", "east", "west", "central")
SEGMENTS = ("consumer", "smb", "enterprise", "public")
LATE_EVERY = 50  # customers the first load leaves out: a re-add brings one (and its orders) in
SQL = ("SELECT c.region, o.day, sum(o.amount * o.qty) AS revenue, count(*) AS orders "
       "FROM {orders} o JOIN {customers} c ON o.customer = c.cid GROUP BY c.region, o.day")
GROUP_COLUMNS = ("region", "day")
OUTPUT = ("region", "day", "revenue", "orders")
FACT_MIX = (("move", 0.3), ("reprice", 0.2), ("delete", 0.2), ("insert", 0.3))
DIM_MIX = (("region", 0.6), ("delete", 0.2), ("readd", 0.2))


def sql(orders: str, customers: str) -> str:
    """The MV's query over two Delta paths."""
    return SQL.format(orders=f"delta.`{orders}`", customers=f"delta.`{customers}`")


def specs(vnodes: int):
    from backfill_assets.upstream.spec import UpstreamSpec

    return (UpstreamSpec("orders", ORDERS, ("id",), vnodes, description="join benchmark"),
            UpstreamSpec("customers", CUSTOMERS, ("cid",), vnodes,
                         description="join benchmark's dimension"))


def definition(orders: str, customers: str, vnodes: int):
    """The platform's join MV (docs/JOINS.md): the same query, `amount * qty` a computed
    column the sum reads."""
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict({
        "name": MV_NAME, "upstream": orders, "primary_key": ["id"],
        "joins": [{"table": customers, "key": ["cid"], "on": {"customer": "cid"},
                   "columns": ["region"], "kind": "inner"}],
        "computed": [{"name": "gross", "expr": "amount * qty"}],
        "group_by": list(GROUP_COLUMNS),
        "aggregates": {"revenue": "sum(gross)", "orders": "count(*)"},
        "vnode_count": vnodes,
    })


def customer_of(ids: pa.Array, customers: int) -> pa.Array:
    """A fact's customer: its id spread over the keys (a multiplicative hash, so one
    customer's orders are scattered over ids, vnodes and days)."""
    return pc.cast(pc.bit_wise_and(pc.multiply(pc.cast(ids, pa.uint64()), 2654435761),
                                   (1 << 32) - 1), pa.int64()).to_numpy() % customers


def _orders(start: int, count: int, days: int, customers: int) -> pa.Table:
    rows = A._orders_rows(start, count, days)
    cust = pa.array(customer_of(rows.column("id").combine_chunks(), customers), pa.int64())
    return pa.table({"id": rows.column("id"), "customer": cust, "amount": rows.column("amount"),
                     "qty": rows.column("qty"), "day": rows.column("day")})


def _customers(keys: range, seed: int = 5) -> pa.Table:
    rng = random.Random(f"{seed}/{keys.start}")
    keys = [k for k in keys if k % LATE_EVERY]
    return pa.table({"cid": pa.array(list(keys), pa.int64()),
                     "region": [rng.choice(REGIONS) for _ in keys],
                     "segment": [rng.choice(SEGMENTS) for _ in keys]})


def prepare(rows: int, customers: int, groups: int, vnodes: int, log=print) -> dict:
    """Create (once; cached) both tables: orders ids 0..rows-1, customers 0..customers-1."""
    from backfill_assets.upstream.spec import create_upstream
    from backfill_assets.upstream.writer.dml import insert_rows

    base = os.path.join(DATA_DIR, f"join_{human_rows(rows)}_{human_rows(customers)}c_"
                        f"{human_rows(groups)}g_{vnodes}v")
    marker = os.path.join(base, "_bench_ready.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(base, ignore_errors=True)
    orders_spec, customers_spec = specs(vnodes)
    days = A.days_for(groups)
    paths = {"orders": os.path.join(base, "orders"), "customers": os.path.join(base, "customers")}
    create_upstream(paths["orders"], orders_spec)
    create_upstream(paths["customers"], customers_spec)
    for start in range(0, customers, LOAD_BATCH):
        keys = range(start, min(customers, start + LOAD_BATCH))
        insert_rows(paths["customers"], _customers(keys), spec=customers_spec,
                    check_existing=False)
    for start in range(0, rows, LOAD_BATCH):
        count = min(LOAD_BATCH, rows - start)
        insert_rows(paths["orders"], _orders(start, count, days, customers), spec=orders_spec,
                    check_existing=False)
        log(f"  orders {human_rows(rows)}: {start + count:,} rows")
    info = {**paths, "rows": rows, "customer_rows": customers, "days": days, "vnodes": vnodes,
            "bytes": dir_bytes(base)}
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return info


class Changes:
    """The DML sequence over both tables: batch i drawn from `random.Random(f"{seed}/i")`
    and the keys alive after the batches before it, so every contender that applies batches
    in the same order writes the same rows."""

    def __init__(self, rows: int, customers: int, days: int, seed: int = 11) -> None:
        self.next_id, self.customers, self.days, self.seed = rows, customers, days, seed
        self.gone: set[int] = set()
        self.gone_customers = list(range(0, customers, LATE_EVERY))
        self.batches = 0

    def _rng(self) -> random.Random:
        self.batches += 1
        return random.Random(f"{self.seed}/{self.batches}")

    def _pick(self, rng: random.Random, limit: int, gone, used: set[int]) -> int:
        while True:
            k = rng.randrange(limit)
            if k not in gone and k not in used:
                used.add(k)
                return k

    def facts(self, n: int):
        """The next fact batch of `n` changes (a DmlBatch) and its counts per kind."""
        from backfill_assets.upstream.writer.dml import DmlBatch

        rng = self._rng()
        kinds = rng.choices([k for k, _ in FACT_MIX], [w for _, w in FACT_MIX], k=n)
        used: set[int] = set()
        inserts, updates, deletes = [], [], []
        for kind in kinds:
            price = decimal.Decimal(rng.randrange(1, 10**6)).scaleb(-2)
            if kind == "insert":
                k, self.next_id = self.next_id, self.next_id + 1
                used.add(k)
                inserts.append({"id": k, "customer": rng.randrange(self.customers),
                                "amount": price, "qty": rng.randrange(1, 1000),
                                "day": A.DAY0 + A.dt.timedelta(days=rng.randrange(self.days))})
            elif kind == "delete":
                k = self._pick(rng, self.next_id, self.gone, used)
                deletes.append(k)
                self.gone.add(k)
            elif kind == "move":
                updates.append({"id": self._pick(rng, self.next_id, self.gone, used),
                                "customer": rng.randrange(self.customers)})
            else:
                updates.append({"id": self._pick(rng, self.next_id, self.gone, used),
                                "amount": price, "qty": rng.randrange(1, 1000)})
        counts = {k: kinds.count(k) for k, _ in FACT_MIX}
        return DmlBatch(inserts=inserts, updates=updates, deletes=deletes), counts

    def dimension(self, n: int):
        """The next dimension batch of `n` changes: region moves, deletes, re-adds."""
        from backfill_assets.upstream.writer.dml import DmlBatch

        rng = self._rng()
        kinds = rng.choices([k for k, _ in DIM_MIX], [w for _, w in DIM_MIX], k=n)
        gone = set(self.gone_customers)
        used: set[int] = set()
        inserts, updates, deletes = [], [], []
        for kind in kinds:
            if kind == "readd" and self.gone_customers:
                k = self.gone_customers.pop(rng.randrange(len(self.gone_customers)))
                gone.discard(k)
                used.add(k)
                inserts.append({"cid": k, "region": rng.choice(REGIONS),
                                "segment": rng.choice(SEGMENTS)})
                continue
            k = self._pick(rng, self.customers, gone, used)
            if kind == "delete":
                deletes.append(k)
            else:
                updates.append({"cid": k, "region": rng.choice(REGIONS)})
        self.gone_customers += deletes
        counts = {"region": len(updates), "delete": len(deletes), "readd": len(inserts)}
        return DmlBatch(inserts=inserts, updates=updates, deletes=deletes), counts
