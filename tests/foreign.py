"""Foreign upstreams for the exactness tests: Delta tables another engine wrote (plain
deltalake), with any column names and every supported type, and live DML on them.

The DML is deltalake MERGE (updates and inserts in one version, deletes in another), which
writes the change data feed as Spark/Databricks would: update pre/post images, inserts,
deletes. Names are quoted for DataFusion (`"name"`), so spaces, dots and unicode work.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from backfill_assets.arrow.types import arrow_type
from backfill_assets.storage import dv

KEY_TYPES = ("int", "bigint", "string", "date", "timestamp", "decimal(18,3)")
VALUE_TYPES = ("int", "bigint", "smallint", "string", "date", "timestamp", "timestamp_ntz",
               "decimal(38,10)", "decimal(5,2)", "boolean", "double", "binary", "null")
UTC = dt.UTC


def value(rng: random.Random, type_: str, nullable: bool = True) -> object:
    """A value of `type_`: extremes, edge cases and ordinary values; sometimes null."""
    if type_ == "null" or (nullable and rng.random() < 0.15):
        return None
    pools: dict[str, list] = {
        "int": [-(2**31), 2**31 - 1, 0, -1, rng.randint(-1000, 1000)],
        "bigint": [-(2**63), 2**63 - 1, 0, rng.randint(-(10**12), 10**12)],
        "smallint": [-(2**15), 2**15 - 1, 0, rng.randint(-300, 300)],
        "string": ["", "España", "日本", "a b.c", "ü" * 40, "x" * rng.randint(1, 50), "'\"`;"],
        "date": [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1),
                 dt.date(2024, 2, 29) + dt.timedelta(days=rng.randint(0, 900))],
        "timestamp": [dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59,
                                                                   999999, tzinfo=UTC),
                      dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                      dt.datetime(2024, 3, 31, 1, 30, tzinfo=UTC)
                      + dt.timedelta(microseconds=rng.randint(0, 10**12))],
        "timestamp_ntz": [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
                          dt.datetime(2024, 3, 31, 2, 30)
                          + dt.timedelta(microseconds=rng.randint(0, 10**12))],
        "decimal(38,10)": [Decimal("9" * 28 + "." + "9" * 10), Decimal("-" + "9" * 28 + ".5"),
                           Decimal("0E-10"), Decimal(rng.randint(-10**15, 10**15)) / 1000],
        "decimal(18,3)": [Decimal("999999999999999.999"), Decimal("-0.001"),
                          Decimal(rng.randint(-10**12, 10**12)) / 1000],
        "decimal(5,2)": [Decimal("999.99"), Decimal("-999.99"), Decimal("0.01"),
                         Decimal(rng.randint(-99999, 99999)) / 100],
        "boolean": [True, False],
        "double": [float("inf"), float("-inf"), float("nan"), -0.0, 1.7976931348623157e308,
                   5e-324, rng.uniform(-1e6, 1e6)],
        "binary": [b"", b"\x00\xff", bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))],
    }
    return rng.choice(pools[type_])


def key_value(rng: random.Random, type_: str, n: int) -> object:
    """The n-th distinct key of `type_` (extremes included: n 0 and 1 are the ends)."""
    ends = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
    if type_ in ends and n < 2:
        return ends[type_][n]
    if type_ in ("int", "bigint"):
        return n * 7919 - 500_000
    if type_ == "string":
        return rng.choice(["", "Ü", "日本", "a b", "k."]) + f"{n:05d}"
    if type_ == "date":
        return dt.date(1, 1, 1) + dt.timedelta(days=n * 997)
    if type_ == "timestamp":
        return dt.datetime(1, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=n * 31_536_007,
                                                               microseconds=n)
    return Decimal(n * 1000 - 123_456) / 1000  # decimal(18,3)


@dataclass
class ForeignTable:
    """A foreign Delta table and a model of its keys for valid random DML."""

    uri: str
    columns: dict[str, str]  # name -> platform type, in order
    key: tuple[str, ...]
    partition_by: str | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    rows: dict = field(default_factory=dict)  # key tuple -> row
    serial: int = 0

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, arrow_type(t)) for n, t in self.columns.items()])

    def new_row(self, key: tuple | None = None) -> dict:
        if key is None:
            self.serial += 1
            key = tuple(key_value(self.rng, self.columns[k], self.serial) for k in self.key)
        row = {n: value(self.rng, t) for n, t in self.columns.items()}
        row.update(zip(self.key, key, strict=True))
        if self.partition_by:
            # non-ASCII and reserved characters: partition values come from the Delta log
            row[self.partition_by] = self.rng.choice(["north", "España", "日本", "east west"])
        return row

    def create(self, n: int) -> None:
        rows = [self.new_row() for _ in range(n)]
        self.rows = {self._key(r): r for r in rows}
        write_deltalake(self.uri, self._arrow(rows), configuration={
            "delta.enableChangeDataFeed": "true"},
            partition_by=[self.partition_by] if self.partition_by else None)

    def churn(self, updates: int, inserts: int, deletes: int) -> None:
        """Two versions: a MERGE of updates + inserts, then a MERGE of deletes."""
        live = list(self.rows)
        self.rng.shuffle(live)
        upserts = [self.new_row(k) for k in live[:updates]]
        upserts += [self.new_row() for _ in range(inserts)]
        doomed = live[updates:updates + deletes]
        if upserts:
            self._merge(self._arrow(upserts)).when_matched_update_all() \
                .when_not_matched_insert_all().execute()
            self.rows.update({self._key(r): r for r in upserts})
        if doomed:
            keys = pa.Table.from_pylist([dict(zip(self.key, k, strict=True)) for k in doomed],
                                        pa.schema([self.schema.field(k) for k in self.key]))
            self._merge(keys).when_matched_delete().execute()
            for k in doomed:
                del self.rows[k]

    def append(self, rows: Sequence[dict]) -> None:
        """A plain append (what a writer that does not enforce the pk does)."""
        write_deltalake(self.uri, self._arrow(list(rows)), mode="append")

    def _merge(self, source: pa.Table):
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in self.key)
        return DeltaTable(self.uri).merge(source, on, source_alias="s", target_alias="t")

    def _arrow(self, rows: list[dict]) -> pa.Table:
        return pa.Table.from_pylist(rows, self.schema)

    def _key(self, row: dict) -> tuple:
        return tuple(row[k] for k in self.key)


def quote(name: str) -> str:
    """A DataFusion SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def spark_quote(name: str) -> str:
    """A Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def z85_crate_tail(data: bytes) -> str:
    """The z85 crate's form (what delta-kernel-rs decodes, and Databricks wrote in kernel-rs'
    cdf-table-with-dv): aligned groups as Delta writes them, then a short tail right-aligned in
    one group whose leading characters are '#', one per missing byte. Written out from the
    crate's documented rule, as an input class; delta-rs reads it back in
    tests/interop/test_inline_dvs.py."""
    whole = len(data) // 4 * 4
    text = dv.z85_encode(data[:whole])
    tail = data[whole:]
    if tail:
        missing = 4 - len(tail)
        text += "#" * missing + dv.z85_encode(bytes(missing) + tail)[missing:]
    return text
