"""Tables the reference writer makes, backfilled by us: a generated foreign
upstream written only by Delta-Spark with what users turn on (deletion vectors through DELETE,
UPDATE and MERGE; the change feed; column mapping in name and id mode with RENAME and DROP
COLUMN between barriers; classic checkpoints every 2 commits; row tracking; timestamp_ntz;
partitioned and clustered layouts; RESTORE TABLE, which shrinks and drops DVs), with generated
column names (spaces, dots, unicode under column mapping) and types (tests/foreign.py's values,
extremes included), and keys whose Delta-Spark statistics are inexact (timestamps truncated to
milliseconds, long strings, decimals beyond a double).

Each MV, in the default mode (snapshot) and in arrangement over the same upstream, is checked
after every barrier against Delta-Spark's own read of the upstream at the version its progress
records, the definition applied by Spark SQL (tests/interop/spark_upstream.py), row for row with
exact column types, and against the platform's oracle (tests.support.assert_verified). What
the platform cannot read is refused by name before anything is written: reader features it
does not implement (typeWidening, v2Checkpoint: UnsupportedTableFeature), a column the MV reads
renamed or dropped, swapped by RENAME or dropped and re-added (UpstreamSchemaChanged; columns it
does not read may be renamed and dropped, and the MV goes on);
a new MV then leaves no folder, a running one no commit, and once the upstream is back (renamed
back, restored) the MV goes on exactly.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.errors import UnsupportedTableFeature, UpstreamSchemaChanged
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.reset import reset_mv
from tests.foreign import spark_quote
from tests.interop.delta_spark import assert_mv_as_delta_spark_reads, recorded_versions
from tests.interop.spark_upstream import Features, SparkUpstream
from tests.reliability.harness import table_versions
from tests.support import _SEEN, assert_verified

pytestmark = pytest.mark.spark
VNODES = 8
MODES = {"snapshot": {"slice_rows": 20}, "arrangement": {"chunk_size": 3}}


@dataclass
class Scenario:
    """One Delta-Spark upstream and an MV per mode over the same columns."""

    spark: object
    warehouse: str
    up: SparkUpstream
    mvs: list[tuple[MVDefinition, MVTables]] = field(default_factory=list)
    finished: dict[str, bool] = field(default_factory=dict)
    marks: list[int] = field(default_factory=list)  # the upstream's version before each DML
    used: list[str] = field(default_factory=list)  # the upstream columns the MVs select

    @classmethod
    def start(cls, spark, warehouse: str, features: Features, seed: int, rows: int = 60,
              modes: tuple[str, ...] = tuple(MODES), up: SparkUpstream | None = None
              ) -> Scenario:
        up = up or SparkUpstream.generated(spark, f"{warehouse}/upstream", features, seed)
        up.create(rows)
        s = cls(spark, warehouse, up, used=up.used_columns(3))
        s.mvs = [s.mv(f"mv_{mode}", mode) for mode in modes]
        return s

    def mv(self, name: str, mode: str) -> tuple[MVDefinition, MVTables]:
        d = self.up.definition(name, mode, self.used, **MODES[mode])
        return d, MVTables.under(self.warehouse, d.name, self.up.uri)

    def dml(self, ops: int = 3) -> None:
        self.marks.append(self.up.version)
        self.up.random_dml(ops)

    def barrier(self) -> int:
        """A barrier for every MV, then both oracles; rows compared."""
        rows = 0
        for d, tables in self.mvs:
            report = run_barrier(self.spark, d, tables, list(range(VNODES)))
            self.finished[d.mode] = self.finished.get(d.mode, False) or report.finished
            where = f"{d.mode} MV after {self.up.done[-4:]} (upstream v{report.v_new})"
            try:
                rows += assert_mv_as_delta_spark_reads(self.spark, d, tables)
                assert_verified(self.spark, d, tables)
                assert not report.finished or \
                    recorded_versions(self.spark, tables) == {report.v_new}
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from exc
        return rows

    def refused(self, error: type, match: str, mvs=None) -> None:
        """Every MV's barrier raises ``error``; a new MV leaves no folder, a running one
        no commit."""
        for d, tables in mvs or self.mvs:
            before = table_versions(tables)
            with pytest.raises(error, match=match):
                run_barrier(self.spark, d, tables, list(range(VNODES)))
            assert table_versions(tables) == before, f"{d.mode}: written before the refusal"
            if before == {"mv": None, "progress": None, "replica": None}:
                assert not any(os.path.exists(getattr(tables, t))
                               for t in ("mv", "progress", "replica")), "a folder was made"

    def unused(self) -> str:
        return next(c for c in self.up.columns if c not in self.used)


# ---------------------------------------------------------------- events between barriers


def restore(s: Scenario) -> None:
    """RESTORE to before the last DML batch (forced to delete and update through DVs first):
    files come back with smaller DVs or none, deleted rows are live again."""
    s.up.delete(3)
    s.up.update(3)
    s.up.restore(s.marks[-1])
    if s.up.features.dvs:
        assert s.up.readded(s.up.version) > 0, "the RESTORE changed no file's DV"


def rename_used_and_back(s: Scenario) -> None:
    """RENAME COLUMN of a column no MV reads: the MV goes on exactly (only what an MV reads
    is pinned); of one they read: refused by name, and renamed back the MV goes on."""
    unread = s.unused()
    s.up.rename(unread, unread + " 2")
    s.dml(2)
    s.barrier()
    column = s.used[-1]
    s.up.rename(column, column + " renamed")
    s.dml(2)
    s.refused(UpstreamSchemaChanged, f"renamed column {re.escape(repr(column))} to")
    s.up.rename(column + " renamed", column)


def drop_and_restore(s: Scenario) -> None:
    """DROP COLUMN of a column no MV reads: the MV goes on exactly; of one they read:
    refused, and after a RESTORE to before that drop (the column is back, with its data) still
    refused, since the versions between hold change rows without the column; rebuilt as the
    refusal says (reset_mv), the MVs go on exactly."""
    s.up.drop(s.unused())
    s.dml(2)
    s.barrier()
    before = s.up.version
    s.up.drop(s.used[-1])
    s.dml(2)
    s.refused(UpstreamSchemaChanged, "dropped column")
    s.up.restore(before)
    s.dml(1)
    s.refused(UpstreamSchemaChanged, rf"version {before + 1} has no column .*reset_mv_job")
    for d, tables in s.mvs:
        reset_mv(d.name, tables, d.name)
        _SEEN.pop(tables.mv, None)  # the feed check starts again with the rebuilt MV


def add_column(s: Scenario) -> None:
    """ADD COLUMNS: tolerated (no MV carries it); the following DML writes it. A name with a
    space needs column mapping."""
    name = "added later" if s.up.features.mapping != "none" else "added_later"
    s.up.alter(f"ADD COLUMNS ({spark_quote(name)} INT)", {**s.up.columns, name: "int"})


def widen_type(s: Scenario) -> None:
    """Type widening switched on and used (a column widened to BIGINT: files written before
    hold the narrower type; a SMALLINT column is added first when there is no int one): its
    reader feature is refused, then and for a new MV over the table."""
    column = next((c for c, t in s.up.columns.items() if t in ("int", "smallint")), None)
    if column is None:
        column = "narrow"
        s.up.alter(f"ADD COLUMNS ({column} SMALLINT)", {**s.up.columns, column: "smallint"})
        s.dml(1)
    s.up.sql(f"ALTER TABLE {s.up.table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    s.up.alter(f"ALTER COLUMN {spark_quote(column)} TYPE BIGINT",
               {**s.up.columns, column: "bigint"})
    s.dml(1)
    s.refused(UnsupportedTableFeature, "typeWidening")
    s.refused(UnsupportedTableFeature, "typeWidening", [s.mv("mv_new", "snapshot")])


def v2_checkpoints(s: Scenario) -> None:
    """V2 checkpoints switched on and written (a UUID-named checkpoint in the log; with
    checkpoints every 2 commits, two DML commits write one): refused, then and for a new MV."""
    s.up.sql(f"ALTER TABLE {s.up.table} SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')")
    s.dml(2)
    if s.up.features.checkpoints == "classic":
        log = os.listdir(os.path.join(s.up.uri, "_delta_log"))
        assert any(re.fullmatch(r"\d{20}\.checkpoint\.[0-9a-f-]{36}\.(json|parquet)", n)
                   for n in log), f"no v2 checkpoint written: {sorted(log)[-6:]}"
    s.refused(UnsupportedTableFeature, "v2Checkpoint")
    s.refused(UnsupportedTableFeature, "v2Checkpoint", [s.mv("mv_new", "arrangement")])


EVENTS: dict[str, Callable[[Scenario], None]] = {
    "restore": restore, "rename": rename_used_and_back, "drop": drop_and_restore,
    "add": add_column}
ENDINGS: dict[str, Callable[[Scenario], None]] = {"widen": widen_type, "v2": v2_checkpoints}


def play(s: Scenario, script: dict[int, str], barriers: int, ending: str | None) -> int:
    """Rounds of DML + barrier, the events of ``script`` before the DML of their round, at
    least ``barriers`` of them and until every MV finished; then the ending (a refusal of a
    running MV and of a new one)."""
    rows, n = 0, 0
    while n < barriers or not all(s.finished.values()):
        assert n < barriers + 6, f"not finished after {n} barriers: {s.finished}"
        if n in script:
            EVENTS[script[n]](s)
        s.dml()
        rows += s.barrier()
        n += 1
    if ending:
        ENDINGS[ending](s)
    return rows


# ------------------------------------------------------------------------------- the tests

CI_CASES = {
    # name mapping, partitioned (a string partition column; null and non-ASCII values),
    # checkpoints every 2 commits, row tracking, a bigint key; renames and drops
    "name-partitioned": (Features(mapping="name", layout="partitioned", row_tracking=True),
                         {1: "restore", 2: "rename", 3: "drop", 4: "add"}, 5, "v2"),
    # id mapping, clustered by a timestamp key (stats truncated to ms), row tracking
    "id-clustered": (Features(mapping="id", layout="clustered", row_tracking=True,
                              key_type="timestamp"), {1: "restore"}, 3, "widen"),
}


@pytest.mark.parametrize("case", list(CI_CASES))
def test_delta_spark_upstream_backfills_as_delta_spark_reads_it(spark, warehouse, case):
    features, script, barriers, ending = CI_CASES[case]
    s = Scenario.start(spark, warehouse, features, seed=37)
    assert play(s, script, barriers, ending) > 0


def test_a_column_swap_by_rename_is_refused(spark, warehouse):
    """RENAME COLUMN a -> swap, b -> a, swap -> b keeps every name and type, and DROP + ADD
    COLUMN of the same name and type makes a new column: the pin's column-mapping identities
    refuse both (step/column_identity.py), with nothing written. What the refusals advise
    works: the columns renamed back (rows written while swapped included), and the MV goes
    on exactly; the upstream restored to before the drop is still refused (the versions
    between lack the column) until the MV is rebuilt, which then goes on exactly."""
    up = SparkUpstream(spark, f"{warehouse}/swapped", Features(mapping="name"),
                       random.Random(5), {"id": "bigint", "a": "int", "b": "int"})
    s = Scenario.start(spark, warehouse, up.features, seed=5, rows=20, modes=("snapshot",),
                       up=up)
    s.barrier()
    swap = [("a", "swap"), ("b", "a"), ("swap", "b")]
    for old, new in swap:
        up.rename(old, new)
    s.dml(2)
    s.refused(UpstreamSchemaChanged, "column '[ab]' is now the column that was '[ab]'")
    for old, new in swap:
        up.rename(old, new)
    s.dml(2)
    s.barrier()
    before = up.version
    up.drop("b")
    up.alter("ADD COLUMNS (b INT)", {**up.columns, "b": "int"})
    s.dml(2)
    s.refused(UpstreamSchemaChanged, "column 'b' was dropped and re-added")
    up.restore(before)
    s.dml(2)
    # the versions between lack the column the MV reads: refused until it is rebuilt
    s.refused(UpstreamSchemaChanged, rf"version {before + 1} has no column 'b'")
    for d, tables in s.mvs:
        reset_mv(d.name, tables, d.name)
        _SEEN.pop(tables.mv, None)
    s.barrier()


@pytest.mark.variant
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_generated_delta_spark_upstreams(spark, warehouse, seed):
    """Random feature combinations, column names and types, key type, events and ending."""
    rng = random.Random(seed)
    features = Features.generated(rng)
    events = ["restore", "add"] + (["rename", "drop"] if features.mapping != "none" else [])
    rng.shuffle(events)
    script = {1 + i: e for i, e in enumerate(events)}
    s = Scenario.start(spark, warehouse, features, seed=seed, rows=rng.randint(30, 90))
    play(s, script, len(script) + 3, rng.choice([None, "widen", "v2"]))
