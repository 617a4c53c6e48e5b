"""Chunked modes read by a seek: an arrangement barrier reads only the
replica files that hold its chunk, however much of the vnode is left, and the MV stays exact
under live DML (the oracle after the barriers; the e2e, exactness and crash tests run the
same read to completion on one-file vnodes); no_shuffle's chunks through Spark tasks.

The replica is created beforehand with 8-row files (production: at least 4,096) so that a
200-row table already has many files per vnode to seek among.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from backfill_assets import storage
from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.positions import chunk_tail
from backfill_assets.core.vnode import vnodes_of
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.preflight import checked_upstream
from backfill_assets.step.seek_chunk import replica_schema
from backfill_assets.storage.chunks import chunk_scan
from backfill_assets.storage.rows import replica
from backfill_assets.storage.writes import bulk
from backfill_assets.upstream.writer import UpstreamSpec
from tests.support import (
    LiveUpstream,
    assert_verified,
    drive,
    simple_mv,
    simple_row,
    simple_spec,
)

VNODES, CHUNK, FILE_ROWS, CHANGES = 4, 10, 8, 4


def _arrangement_with_small_files(warehouse: str, chunk: int) -> tuple[MVDefinition, MVTables]:
    """An arrangement MV over ``orders`` whose replica will be copied into 8-row files."""
    d = simple_mv(VNODES, mode="arrangement", chunk_size=chunk)
    tables = MVTables.under(warehouse, d.name, "orders")
    schema = replica.table_schema(replica_schema(checked_upstream(tables, d, None).schema))
    owned_tables.ensure_data_table(tables.replica, schema, {}, cdf=False, key_names=("id",),
                               vnode_count=VNODES,
                               layout={storage.SEEK_ROWS_PROPERTY: str(FILE_ROWS)})
    return d, tables


@pytest.mark.parametrize("engine", ["driver", "local_master", "spark"])
def test_arrangement_barriers_read_their_chunk_not_the_remainder(spark, warehouse, engine,
                                                                 monkeypatch):
    """``engine``: where the chunk's read tasks run; a read this small runs in the driver
    (``bulk.LOCAL_READ_ROWS``), and so does a larger one on a local master (the
    tests' session: ``read.tasks_run_here``); elsewhere, in Spark tasks."""
    if engine != "driver":
        monkeypatch.setattr(bulk, "LOCAL_READ_ROWS", 0)
    if engine == "spark":
        monkeypatch.setattr(bulk, "tasks_run_here", lambda spark_: False)
    local_runs = []
    run_locally = bulk._local_manifest
    monkeypatch.setattr(bulk, "_local_manifest",
                        lambda *a: local_runs.append(1) or run_locally(*a))
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(5),
                        simple_row, lambda rng: rng.randint(1, 100_000))
    live.create(rows=200)
    d, tables = _arrangement_with_small_files(warehouse, CHUNK)
    scanned = []
    for n in range(3):
        live.apply(live.random_batch(CHANGES))
        report = run_barrier(spark, d, tables, list(range(VNODES)))
        assert 0 < report.snapshot_rows <= VNODES * (CHUNK + chunk_tail(CHUNK, None))
        scanned.append(report.extra["snapshot_rows_scanned"])
        # the first chunk comes from the replica's copy itself (no file read back), the
        # others from a seek, projected and written by the read tasks
        assert report.extra["bulk_engine"] == (
            "arrow: written by the replica's copy" if n == 0 else "arrow"), report.extra
        # per vnode: the chunk, the file it starts in and the one it ends in; plus the
        # barriers' change files (each spans every vnode and every key)
        assert scanned[-1] <= VNODES * (CHUNK + 2 * FILE_ROWS) + 2 * CHANGES * (n + 1), scanned
    assert_verified(spark, d, tables)
    copied = storage.TableVersion.load(tables.replica, None, {})
    one_vnode = [f for f in copied.files
                 if f.stats.get(("min", "vnode")) == f.stats.get(("max", "vnode"))]
    assert len(one_vnode) >= 200 // FILE_ROWS - VNODES  # the bulk copy: one vnode per file
    # the replica's copy (barrier 0: bulk tasks run here on a local master), barriers 1, 2
    assert (len(local_runs) == 3) if engine != "spark" else not local_runs


def test_a_vnodes_last_sliver_is_read_with_its_last_chunk(spark, warehouse):
    """Unthrottled, a vnode whose whole rest is at most a quarter of a chunk more than the
    chunk takes it in the same barrier (``core.positions.keep_rows``), from the replica's
    copy (barrier 0) and from a seek over 8-row files (barrier 1): two barriers, not three,
    and the MV exact. The chunk size is chosen from the vnodes' sizes so that every vnode
    needs more than one chunk and some need the tail."""
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(11),
                        simple_row, lambda rng: rng.randint(1, 100_000))
    live.create(rows=400)
    sizes = Counter(vnodes_of([(k,) for k in live.keys], ["bigint"], VNODES)).values()
    chunk = next(c for c in range(8, max(sizes))
                 if min(sizes) > c and 2 * c < max(sizes) <= 2 * c + chunk_tail(c, None))
    d, tables = _arrangement_with_small_files(warehouse, chunk)
    first = run_barrier(spark, d, tables, list(range(VNODES)))
    assert first.snapshot_rows == VNODES * chunk and not first.finished
    last = run_barrier(spark, d, tables, list(range(VNODES)))
    assert last.finished and last.extra["bulk_engine"] == "arrow", last.extra
    assert last.snapshot_rows == sum(sizes) - VNODES * chunk
    assert_verified(spark, d, tables)


def test_bulk_key_stats_from_the_log_equal_the_rows(spark, warehouse):
    """Snapshot mode's bulk read takes per-vnode rows and last key from the log when that is
    exact (a platform upstream, one vnode per file, no DVs, one integer pk): after random DML
    they equal what the read tasks compute from the key columns, and the live keys."""
    live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(11),
                        simple_row, lambda rng: rng.randint(1, 100_000))
    live.create(rows=120)
    for _ in range(3):
        live.apply(live.random_batch(CHANGES * 3))
    snap = storage.TableVersion.load(live.uri, None, {})
    positions = dict.fromkeys(range(VNODES))
    from_log = storage.vnode_stats_from_log(snap.files, "id", positions)
    assert from_log is not None
    key_order = KeyOrder((KeyColumn("id", "bigint"),))
    from_rows = storage.vnode_key_stats(spark, snap, key_order, positions)
    assert from_log == from_rows
    expected: dict[int, list] = {}
    for key in live.keys:
        expected.setdefault(live.spec.vnode_of((key,)), []).append(key)
    assert from_log == {v: (len(ks), (max(ks),), False) for v, ks in expected.items()}


@pytest.mark.parametrize("pk", ["id", "region_id"])
def test_no_shuffle_chunks_written_by_spark_tasks(spark, warehouse, monkeypatch, pk):
    """no_shuffle's chunks through Spark tasks (forced here: ``LOCAL_READ_ROWS`` 0, a master
    taken as remote, and
    16-row tasks so that a chunk is several of them), over a single and a composite pk with
    a descending column: the driver's cut, then each task's rows up to it. The MV is exact
    after every barrier under live DML, and the barriers with snapshot rows ran Spark jobs of
    several tasks, one a partition (``read.one_task_per_partition``)."""
    monkeypatch.setattr(bulk, "LOCAL_READ_ROWS", 0)
    monkeypatch.setattr(bulk, "tasks_run_here", lambda spark_: False)
    monkeypatch.setattr(chunk_scan, "TASK_ROWS", 16)
    jobs = []
    manifest = bulk._manifest
    monkeypatch.setattr(bulk, "_manifest",
                        lambda spark_, tasks, task: jobs.append(len(tasks))
                        or manifest(spark_, tasks, task))
    if pk == "id":
        live = LiveUpstream(f"{warehouse}/orders", simple_spec(VNODES), random.Random(7),
                            simple_row, lambda rng: rng.randint(1, 100_000))
        d = simple_mv(VNODES, mode="no_shuffle", chunk_size=37)
    else:
        spec = UpstreamSpec(name="orders", columns={"region": "string", "id": "bigint",
                                                    "qty": "int"},
                            primary_key=("region", "id"), vnode_count=VNODES)
        live = LiveUpstream(f"{warehouse}/orders", spec, random.Random(8),
                            lambda rng, k: {"region": k[0], "id": k[1], "qty": rng.randint(0, 9)},
                            lambda rng: (rng.choice(["eu", "us", "apac"]), rng.randint(-500, 500)))
        d = MVDefinition.from_dict({
            "name": "by_region", "upstream": "orders", "mode": "no_shuffle", "chunk_size": 37,
            "primary_key": ["region", {"name": "id", "descending": True}],
            "columns": ["region", "id", "qty"], "filter": "qty > 2",
            "vnode_count": VNODES})
    live.create(rows=200)
    tables = MVTables.under(warehouse, d.name, "orders")
    stats = drive(spark, d, tables, live, ranges=[range(VNODES)], changes_per_barrier=6)
    assert stats["snapshot_rows"] > 150 and len(jobs) >= 4 and max(jobs) > 1, (stats, jobs)
