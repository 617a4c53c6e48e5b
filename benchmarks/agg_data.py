"""The aggregate benchmark's rows: an `orders` upstream, the aggregate over it, and the DML
every contender sees (benchmarks/bench_aggregate.py).

The upstream is the load generator's table (`initial_rows_table`: `region`, `id`, `amount
decimal(12,2)` as the order's price, `qty int`, `day date`), written through the platform's
upstream writer (`insert_rows`, change data feed on) in versions of `LOAD_BATCH` rows, with
`day` drawn from `groups / 5` days so that (region, day) has about `groups` groups (the load
generator's own `day` spans 3,650 days: 18,250 groups). Cached under BENCH_DATA per shape.

The DML is one deterministic sequence per seed (`ChangeStream`): each batch of n changes is
30% updates that move a row to another day (a group move: the old group must lose it), 20%
updates of price and quantity in place, 20% deletes and 30% inserts, applied by the
platform's writer as one Delta version (`apply_dml`). Every contender's private copy of the
upstream receives the same batches in the same order, so all see the same rows.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import shutil

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.bench_data import DATA_DIR, LOAD_BATCH, dir_bytes, human_rows

COLUMNS = ("region", "id", "amount", "qty", "day")
DAY0 = dt.date(2020, 1, 1)
REGION_COUNT = 5  # the load generator's REGIONS
MIX = (("move", 0.3), ("reprice", 0.2), ("delete", 0.2), ("insert", 0.3))
MV_NAME = "revenue_by_region_day"
# the aggregate every contender maintains, as a user writes it in Spark SQL
SQL = ("SELECT region, day, sum(amount * qty) AS revenue, count(*) AS orders, "
       "avg(amount) AS avg_price FROM orders GROUP BY region, day")
GROUP_COLUMNS = ("region", "day")
AGG_EXPRS = ("sum(amount * qty) AS revenue", "count(*) AS orders", "avg(amount) AS avg_price")


def days_for(groups: int) -> int:
    return max(1, groups // REGION_COUNT)


def orders_spec(vnodes: int):
    from backfill_assets.upstream.writer import demo_spec

    return demo_spec("orders", vnodes, False, COLUMNS)


def definition(uri: str, vnodes: int, mode: str = "snapshot"):
    """The platform's aggregate MV over the orders upstream (docs/AGGREGATES.md): the same
    query as SQL, `amount * qty` as a computed column the sum reads."""
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict({
        "name": MV_NAME, "upstream": uri, "primary_key": ["id"],
        "computed": [{"name": "gross", "expr": "amount * qty"}],
        "group_by": list(GROUP_COLUMNS),
        "aggregates": {"revenue": "sum(gross)", "orders": "count(*)",
                       "avg_price": "avg(amount)"},
        "mode": mode, "vnode_count": vnodes, "chunk_size": 1_000_000,
    })


def orders_path(rows: int, groups: int, vnodes: int) -> str:
    return os.path.join(DATA_DIR, f"orders_{human_rows(rows)}_{human_rows(groups)}g_{vnodes}v")


def _orders_rows(start: int, count: int, days: int) -> pa.Table:
    """The load generator's rows with `day` spread over `days` days, independent of region
    (region follows id modulo 5; the day follows id // 5)."""
    from backfill_assets.upstream.writer.load_generator import initial_rows_table

    rows = initial_rows_table(0, start, count)
    ids = rows.column("id")
    spread = pc.multiply(pc.divide(ids, REGION_COUNT), 7919)
    index = pc.subtract(spread, pc.multiply(pc.divide(spread, days), days))
    epoch_days = pc.add(pc.cast(index, pa.int32()), pa.scalar((DAY0 - dt.date(1970, 1, 1)).days,
                                                              pa.int32()))
    day = pc.cast(epoch_days, pa.date32())
    return rows.set_column(rows.schema.get_field_index("day"), "day", day).select(COLUMNS)


def prepare_orders(rows: int, groups: int, vnodes: int, log=print) -> dict:
    """Create (once; cached) the orders upstream of `rows` rows, ids 0..rows-1."""
    from backfill_assets.upstream.spec import create_upstream
    from backfill_assets.upstream.writer.dml import insert_rows

    path = orders_path(rows, groups, vnodes)
    marker = os.path.join(path, "_bench_ready.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(path, ignore_errors=True)
    spec = orders_spec(vnodes)
    create_upstream(path, spec)
    days = days_for(groups)
    for start in range(0, rows, LOAD_BATCH):
        count = min(LOAD_BATCH, rows - start)
        version = insert_rows(path, _orders_rows(start, count, days), spec=spec,
                              check_existing=False)
        log(f"  orders {human_rows(rows)}: {start + count:,} rows (version {version})")
    info = {"path": path, "rows": rows, "groups_asked": groups, "days": days,
            "vnodes": vnodes, "version": version, "bytes": dir_bytes(path)}
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return info


class ChangeStream:
    """The DML sequence over an orders upstream of ids 0..rows-1: batch i is drawn from
    `random.Random(f"{seed}/{i}")` and the keys alive after batches 1..i-1, so every contender
    that applies batches in the same order writes the same rows."""

    def __init__(self, rows: int, days: int, seed: int = 11) -> None:
        self.next_id, self.days, self.seed = rows, days, seed
        self.gone: set[int] = set()
        self.batches = 0

    def _pick(self, rng: random.Random, used: set[int]) -> int:
        while True:
            k = rng.randrange(self.next_id)
            if k not in self.gone and k not in used:
                used.add(k)
                return k

    def _day(self, rng: random.Random) -> dt.date:
        return DAY0 + dt.timedelta(days=rng.randrange(self.days))

    def batch(self, n: int):
        """The next batch of `n` changes (a DmlBatch) and its counts per kind."""
        from backfill_assets.upstream.writer.dml import DmlBatch
        from backfill_assets.upstream.writer.live_keys import REGIONS

        self.batches += 1
        rng = random.Random(f"{self.seed}/{self.batches}")
        kinds = rng.choices([k for k, _ in MIX], [w for _, w in MIX], k=n)
        used: set[int] = set()
        inserts, updates, deletes = [], [], []
        for kind in kinds:
            price = decimal.Decimal(rng.randrange(1, 10**6)).scaleb(-2)
            if kind == "insert":
                k, self.next_id = self.next_id, self.next_id + 1
                used.add(k)
                inserts.append({"region": REGIONS[k % REGION_COUNT], "id": k, "amount": price,
                                "qty": rng.randrange(1, 1000), "day": self._day(rng)})
            elif kind == "delete":
                k = self._pick(rng, used)
                deletes.append(k)
                self.gone.add(k)
            elif kind == "move":
                updates.append({"id": self._pick(rng, used), "day": self._day(rng)})
            else:
                updates.append({"id": self._pick(rng, used), "amount": price,
                                "qty": rng.randrange(1, 1000)})
        counts = {k: kinds.count(k) for k, _ in MIX}
        return DmlBatch(inserts=inserts, updates=updates, deletes=deletes), counts


def fraction_plan(rows: int, fractions: list[float], repeat: int) -> list[tuple[float, int]]:
    """The batches every contender applies, in order: `repeat` of each fraction of `rows`."""
    return [(f, max(1, round(rows * f))) for f in fractions for _ in range(repeat)]
