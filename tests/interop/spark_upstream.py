"""Foreign upstreams written by Delta-Spark: `SparkUpstream` is a Delta table created and
changed only through Delta-Spark (CREATE TABLE with the table properties users turn on, INSERT,
UPDATE, DELETE, MERGE, RESTORE, ALTER TABLE), with generated column names and types
(tests/foreign.py's values, extremes included) and a model of its live keys good enough to aim
DML at them (fresh keys are never reused, so no write can duplicate a key; after a RESTORE the
keys are read back). Its oracle is tests/interop/delta_spark.py's
`assert_mv_as_delta_spark_reads`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import functions as F

from backfill_assets.arrow.types import arrow_type, type_name
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.storage import spark_schema
from tests.foreign import key_value, spark_quote, value

UTC = dt.UTC
# names a Delta-Spark table takes: any name under column mapping, no ' ,;{}()\n\t=' without
PLAIN_NAMES = ("qty", "label", "größe", "día", "名前", "flag", "at", "blob", "ratio", "small",
               "price", "ts")
MAPPED_NAMES = ("na me", "dot.ted", "größe (kg)", "semi;colon", "名 前", "eq=sign",
                "with,comma", "{curly}", "ünï cödé", "a b c", "x", "tab\tbed")
VALUE_TYPES = ("int", "bigint", "smallint", "string", "date", "timestamp", "decimal(38,10)",
               "decimal(5,2)", "boolean", "double", "binary")
PARTITION_VALUES = {"string": ["north", "España", "日本", "east west", None],
                    "int": [1, 2, -7, None], "date": [dt.date(2024, 2, 29), dt.date(1, 1, 1)]}


@dataclass(frozen=True)
class Features:
    """What a table variant turns on (the table properties and layout Delta-Spark writes)."""

    mapping: str = "none"  # column mapping: none | name | id
    layout: str = "plain"  # plain | partitioned | clustered
    checkpoints: str = "classic"  # classic (every 2 commits) | default (every 10)
    dvs: bool = True
    row_tracking: bool = False
    ntz: bool = True  # a timestamp_ntz column
    key_type: str = "bigint"

    @property
    def properties(self) -> dict[str, str]:
        out = {"delta.enableChangeDataFeed": "true",
               "delta.enableDeletionVectors": str(self.dvs).lower()}
        if self.mapping != "none":
            out["delta.columnMapping.mode"] = self.mapping
        if self.checkpoints == "classic":
            out["delta.checkpointInterval"] = "2"
        if self.row_tracking:
            out["delta.enableRowTracking"] = "true"
        return out

    @classmethod
    def generated(cls, rng: random.Random) -> Features:
        """A random combination of what the platform reads (the refused ones aside)."""
        return cls(mapping=rng.choice(["none", "name", "id"]),
                   layout=rng.choice(["plain", "partitioned", "clustered"]),
                   checkpoints=rng.choice(["classic", "default"]), dvs=rng.random() < 0.8,
                   row_tracking=rng.random() < 0.5, ntz=rng.random() < 0.7,
                   key_type=rng.choice(["int", "bigint", "string", "date", "timestamp",
                                        "decimal(18,3)"]))


def generated_key(type_: str, n: int) -> object:
    """The n-th key: where Delta-Spark's statistics are inexact (timestamps truncated to
    milliseconds, strings to 32 characters, decimals written as JSON numbers), keys differ
    below that precision so a reader trusting the stats as exact would skip or misplace rows."""
    if type_ == "timestamp":
        return dt.datetime(2024, 3, 31, 1, 30, tzinfo=UTC) + dt.timedelta(microseconds=n * 137)
    if type_ == "string":
        return ("k" * 33 if n % 3 else "Ü") + f"{n:05d}"
    if type_ == "decimal(18,3)":
        return Decimal("987654321012345.000") + Decimal(n) / 1000 - Decimal(n % 2) * 10**15
    return key_value(random.Random(n), type_, n)


def sql_literal(type_: str, v: object) -> str:
    """A Spark SQL literal of ``v`` as a ``type_`` value (any value of tests/foreign.py)."""
    if v is None:
        return f"CAST(NULL AS {type_.upper()})"
    if type_ == "string":
        return f"CAST(X'{v.encode().hex()}' AS STRING)"
    if type_ == "binary":
        return f"X'{v.hex()}'"
    if type_ == "boolean":
        return "TRUE" if v else "FALSE"
    if type_ == "date":
        return f"DATE'{v.isoformat():0>10}'"
    if type_ in ("timestamp", "timestamp_ntz"):
        epoch = dt.datetime(1970, 1, 1, tzinfo=UTC if type_ == "timestamp" else None)
        micros = (v - epoch) // dt.timedelta(microseconds=1)
        return f"CAST(TIMESTAMP_MICROS({micros}) AS {type_.upper()})"
    if type_ == "double":
        text = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(repr(v), repr(v))
        return f"CAST('{text}' AS DOUBLE)"
    text = format(v, "f") if isinstance(v, Decimal) else str(v)
    return f"CAST('{text}' AS {type_.upper()})"


@dataclass
class SparkUpstream:
    """A foreign upstream only Delta-Spark writes; columns by their current logical names."""

    spark: object
    uri: str
    features: Features
    rng: random.Random
    columns: dict[str, str] = field(default_factory=dict)  # name -> platform type, in order
    key: str = "id"
    partition: str | None = None
    keys: set = field(default_factory=set)
    serial: int = 0
    done: list[str] = field(default_factory=list)  # what was written, for failure messages
    make_row: Callable[[random.Random, object], dict] | None = None  # else foreign's values

    @classmethod
    def generated(cls, spark, uri: str, features: Features, seed: int, values: int = 5
                  ) -> SparkUpstream:
        rng = random.Random(seed)
        mapped = features.mapping != "none"
        names = iter(rng.sample(MAPPED_NAMES if mapped else PLAIN_NAMES, values + 1))
        types = [t for t in VALUE_TYPES if features.ntz or t != "timestamp_ntz"]
        columns = {"clé id" if mapped else "id": features.key_type}
        columns.update({next(names): rng.choice(types) for _ in range(values)})
        if features.ntz:
            columns[next(names)] = "timestamp_ntz"
        up = cls(spark, uri, features, rng, columns, key=next(iter(columns)))
        if features.layout == "partitioned":
            up.partition = "région" if mapped else "region"
            up.columns[up.partition] = rng.choice(list(PARTITION_VALUES))
        return up

    # ------------------------------------------------------------------------ writing

    def sql(self, text: str) -> None:
        self.spark.sql(text).collect()

    @property
    def table(self) -> str:
        return f"delta.`{self.uri}`"

    @property
    def version(self) -> int:
        """The latest commit, by a listing of the log (any reader feature)."""
        log = os.path.join(self.uri, "_delta_log")
        return max(int(n[:20]) for n in os.listdir(log) if re.fullmatch(r"\d{20}\.json", n))

    def create(self, rows: int) -> None:
        f = self.features
        cols = ", ".join(f"{spark_quote(n)} {t.upper()}" for n, t in self.columns.items())
        layout = {"partitioned": f"PARTITIONED BY ({spark_quote(self.partition or '')})",
                  "clustered": f"CLUSTER BY ({spark_quote(self.key)})"}.get(f.layout, "")
        props = ", ".join(f"'{k}' = '{v}'" for k, v in f.properties.items())
        self.sql(f"CREATE TABLE {self.table} ({cols}) USING delta {layout} "
                 f"TBLPROPERTIES ({props})")
        self.append(rows)

    def mint(self) -> object:
        """A fresh key (never used before, so no write can duplicate one)."""
        self.serial += 1
        key = generated_key(self.columns[self.key], self.serial)
        self.keys.add(key)
        return key

    def values(self) -> dict:
        if self.make_row is not None:
            return {k: v for k, v in self.make_row(self.rng, None).items() if k != self.key}
        out = {n: value(self.rng, t) for n, t in self.columns.items() if n != self.key}
        if self.partition:
            out[self.partition] = self.rng.choice(PARTITION_VALUES[self.columns[self.partition]])
        return out

    def row(self, key: object | None = None) -> dict:
        return {**self.values(), self.key: self.mint() if key is None else key}

    def frame(self, rows: Sequence[dict], extra: dict[str, str] | None = None):
        types = {**self.columns, **(extra or {})}
        schema = pa.schema([pa.field(n, arrow_type(t)) for n, t in types.items()])
        table = pa.Table.from_pylist(list(rows), schema)
        return self.spark.createDataFrame(table, schema=spark_schema(schema))

    def append(self, n: int) -> None:
        self.frame([self.row() for _ in range(n)]).write.format("delta").mode("append") \
            .save(self.uri)
        self.done.append(f"append {n}")

    def pick(self, n: int) -> list:
        live = sorted(self.keys, key=repr)
        return self.rng.sample(live, min(n, len(live)))

    def _in(self, keys: Sequence) -> str:
        t = self.columns[self.key]
        return f"{spark_quote(self.key)} IN ({', '.join(sql_literal(t, k) for k in keys)})"

    def update(self, n: int) -> None:
        """UPDATE ... SET one or two value columns (the partition column moves rows)."""
        keys = self.pick(n)
        targets = self.rng.sample([c for c in self.columns if c != self.key], 2)
        values = self.values()
        sets = ", ".join(f"{spark_quote(c)} = {sql_literal(self.columns[c], values[c])}"
                         for c in targets)
        if keys:
            self.sql(f"UPDATE {self.table} SET {sets} WHERE {self._in(keys)}")
            self.done.append(f"update {len(keys)}")

    def delete(self, n: int) -> None:
        keys = self.pick(n)
        if keys:
            self.sql(f"DELETE FROM {self.table} WHERE {self._in(keys)}")
            self.keys.difference_update(keys)
            self.done.append(f"delete {len(keys)}")

    def move_keys(self, n: int) -> None:
        """UPDATE of the primary key itself (a key leaves, another arrives)."""
        old = self.pick(n)
        if not old:
            return
        t, k = self.columns[self.key], spark_quote(self.key)
        new = [self.mint() for _ in old]
        cases = " ".join(f"WHEN {sql_literal(t, a)} THEN {sql_literal(t, b)}"
                         for a, b in zip(old, new, strict=True))
        self.sql(f"UPDATE {self.table} SET {k} = CASE {k} {cases} END WHERE {self._in(old)}")
        self.keys.difference_update(old)
        self.done.append(f"move {len(old)} keys")

    def merge(self, updates: int, inserts: int, deletes: int, op: str = "op") -> None:
        """The streaming upsert: one MERGE of updates, inserts and deletes (op 'D')."""
        keys = self.pick(updates + deletes)
        rows = [{**self.row(k), op: "U"} for k in keys[:updates]]
        rows += [{**self.row(k), op: "D"} for k in keys[updates:]]
        rows += [{**self.row(), op: "I"} for _ in range(inserts)]
        self.frame(rows, {op: "string"}).createOrReplaceTempView("merge_batch")
        k = spark_quote(self.key)
        self.sql(f"MERGE INTO {self.table} t USING merge_batch s ON t.{k} = s.{k} "
                 f"WHEN MATCHED AND s.{op} = 'D' THEN DELETE WHEN MATCHED THEN UPDATE SET * "
                 f"WHEN NOT MATCHED AND s.{op} != 'D' THEN INSERT *")
        self.keys.difference_update(keys[updates:])
        self.done.append(f"merge {len(rows)}")

    def restore(self, version: int) -> None:
        """RESTORE TABLE (its schema too): keys and columns read back."""
        self.sql(f"RESTORE TABLE {self.table} TO VERSION AS OF {version}")
        read = self.spark.read.format("delta").load(self.uri)
        self.columns = {f.name: type_name(f.type) for f in read.limit(0).toArrow().schema}
        self.keys = set(read.select(F.col(spark_quote(self.key))).toArrow().column(0).to_pylist())
        self.done.append(f"restore to v{version}")

    def commit(self, version: int) -> list[dict]:
        """The actions of commit ``version`` as the log holds them."""
        with open(os.path.join(self.uri, "_delta_log", f"{version:020d}.json"), "rb") as f:
            return [json.loads(line) for line in f if line.strip()]

    def readded(self, version: int) -> int:
        """Files commit ``version`` removes and adds back (with another DV, or none)."""
        actions = self.commit(version)
        paths = [{a[kind]["path"] for a in actions if kind in a} for kind in ("add", "remove")]
        return len(paths[0] & paths[1])

    def wrote_dvs(self) -> bool:
        """Whether a commit added a file with a deletion vector."""
        return any(a.get("add", {}).get("deletionVector")
                   for v in range(self.version + 1) for a in self.commit(v))

    def alter(self, clause: str, columns: dict[str, str]) -> None:
        self.sql(f"ALTER TABLE {self.table} {clause}")
        self.columns = dict(columns)
        self.done.append(clause)

    def rename(self, old: str, new: str) -> None:
        cols = {(new if n == old else n): t for n, t in self.columns.items()}
        self.alter(f"RENAME COLUMN {spark_quote(old)} TO {spark_quote(new)}", cols)

    def drop(self, name: str) -> None:
        self.alter(f"DROP COLUMN {spark_quote(name)}",
                   {n: t for n, t in self.columns.items() if n != name})

    def random_dml(self, ops: int = 3) -> None:
        """``ops`` commits among UPDATE, DELETE, MERGE, INSERT and pk-moving UPDATE; small
        batches of keys anywhere in the key space."""
        for _ in range(ops):
            kind = self.rng.choice(["update", "delete", "merge", "merge", "append", "move"])
            n = self.rng.randint(1, 5)
            if kind == "merge":
                self.merge(n, self.rng.randint(0, 3), self.rng.randint(0, 2))
            elif kind == "move":
                self.move_keys(1)
            else:
                getattr(self, kind)(n)

    def used_columns(self, count: int) -> list[str]:
        """The key plus ``count`` value columns, the partition column among them."""
        values = [c for c in self.columns if c not in (self.key, self.partition)]
        return [self.key, *([self.partition] if self.partition else []),
                *self.rng.sample(values, min(count, len(values)))]

    def definition(self, name: str, mode: str, used: Sequence[str], **extra) -> MVDefinition:
        """An MV over ``used`` columns: a filter on one of them, computed columns on two."""
        values = [c for c in used if c != self.key]
        return MVDefinition.from_dict({
            "name": name, "upstream": self.uri, "primary_key": [self.key], "columns": list(used),
            "filter": " OR ".join(predicate(c, self.columns[c]) for c in values[:2]) or None,
            "computed": [{"name": f"f{i} {c}", "expr": computed(c, self.columns[c])}
                         for i, c in enumerate(values[-2:])],
            "mode": mode, "vnode_count": 8, **extra})


# per column type: a filter that never fails (NaN and extremes included) and a computed
# column that cannot overflow in ANSI mode (Spark 4's default)
PREDICATES = {"string": "{q} >= 'b'", "boolean": "NOT {q}", "binary": "length({q}) > 1",
              "date": "{q} > DATE'2000-01-01'", "timestamp": "{q} > TIMESTAMP'2000-01-01'",
              "timestamp_ntz": "{q} > TIMESTAMP_NTZ'2000-01-01 00:00:00'"}
COMPUTED = {"string": "upper({q})", "double": "{q} * 2", "decimal": "abs({q})",
            **dict.fromkeys(("int", "bigint", "smallint"), "CAST({q} AS DECIMAL(20,0)) * 3")}


def predicate(name: str, type_: str) -> str:
    return PREDICATES.get(type_, "{q} > 0").format(q=spark_quote(name))


def computed(name: str, type_: str) -> str:
    return COMPUTED.get(type_.split("(")[0], "{q} IS NULL").format(q=spark_quote(name))
