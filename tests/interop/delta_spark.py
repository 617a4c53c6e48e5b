"""Delta-Spark, the reference implementation, as a second oracle: its own reads of a table at a
version and of its change feed, compared with delta-rs' (an independent reader) and with the
rows the platform's oracle recomputes.

Every check goes through the session's Delta catalog (`format("delta")`, `readChangeFeed`,
`DESCRIBE HISTORY` / `DETAIL`): the jars resources/delta_jars.py puts on every classic
session, nothing fetched at run time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable

CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def canon(row: dict) -> str:
    return json.dumps({k: str(v) for k, v in row.items() if k not in CDF_COLUMNS},
                      sort_keys=True)


def multiset(rows: Sequence[dict]) -> Counter:
    return Counter(canon(r) for r in rows)


def spark_rows(spark, uri: str, version: int | None = None) -> list[dict]:
    """Delta-Spark's read of ``uri`` (at ``version``), as plain rows."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return [r.asDict() for r in reader.load(uri).collect()]


def spark_changes(spark, uri: str, start: int, end: int) -> list[dict]:
    """Delta-Spark's change feed of versions [start, end]."""
    df = (spark.read.format("delta").option("readChangeFeed", "true")
          .option("startingVersion", start).option("endingVersion", end).load(uri))
    return [r.asDict() for r in df.collect()]


def assert_versions_read_alike(spark, uri: str, first: int, last: int) -> int:
    """Every version in [first, last]: Delta-Spark's rows == delta-rs' rows (both honour
    deletion vectors, column mapping and partition values); the versions checked."""
    for v in range(first, last + 1):
        theirs = multiset(spark_rows(spark, uri, v))
        ours = multiset(pa.table(DeltaTable(uri, version=v).scan()).to_pylist())
        assert theirs == ours, f"{uri} v{v}: Delta-Spark and delta-rs read different rows"
    return last - first + 1


def assert_feed_replays(spark, uri: str, key_names: Sequence[str], start: int, end: int
                        ) -> None:
    """Delta-Spark's change feed of (start, end] applied to the rows of ``start`` gives the
    rows of ``end``: each delete / pre-image removes a held row exactly, each insert /
    post-image adds a key not held. What a user's streaming MERGE would do with our MV."""
    def key(r: dict) -> tuple:
        return tuple(str(r[k]) for k in key_names)

    held = {key(r): canon(r) for r in spark_rows(spark, uri, start)}
    feed = spark_changes(spark, uri, start + 1, end)
    for v in sorted({r["_commit_version"] for r in feed}):
        rows = [r for r in feed if r["_commit_version"] == v]
        for r in rows:
            if r["_change_type"] in ("delete", "update_preimage"):
                assert held.pop(key(r), None) == canon(r), f"{uri} v{v} removes {r}: not held"
        for r in rows:
            if r["_change_type"] in ("insert", "update_postimage"):
                assert key(r) not in held, f"{uri} v{v} inserts a held key: {r}"
                held[key(r)] = canon(r)
    now = {key(r): canon(r) for r in spark_rows(spark, uri, end)}
    assert held == now, f"{uri}: the change feed ({start}, {end}] does not replay"


def assert_history_and_detail(spark, uri: str) -> None:
    """DESCRIBE HISTORY lists every version the log keeps, newest first; DESCRIBE DETAIL
    counts the live files delta-rs counts."""
    latest = DeltaTable(uri).version()
    history = [r["version"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()]
    assert history[0] == latest and history == sorted(history, reverse=True)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0].asDict()
    assert detail["format"] == "delta"
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).num_rows
    assert detail["numFiles"] == files
