"""A folder catalog's barriers for real (Spark, delta-rs, Dagster runs): one sensor for all,
lineage order, a chain of three exact at every barrier under a live writer, two MVs over one
upstream in different modes, an MV added and one dropped while the sensor runs."""

from __future__ import annotations

import os
import threading

import dagster as dg
import yaml

from backfill_assets.core.errors import MVResetRefused
from backfill_assets.definitions import build_definitions
from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.verify.oracle import verify
from resources.catalog import load_catalog
from resources.mv import mv_tables
from resources.settings import load_settings

VNODES = 4
BASE = {"upstream": "upstream", "primary_key": ["id"], "columns": ["id", "region", "qty"],
        "vnode_count": VNODES, "chunk_size": 5000}
CHAIN = {  # a -> b -> c over the upstream, and d beside a over the same upstream
    "a.yaml": {**BASE, "filter": "qty > 0"},
    "b.yaml": {**BASE, "upstream": "a/downstream_mv", "filter": "qty > 2", "mode": "no_shuffle"},
    "c.yaml": {**BASE, "upstream": "b/downstream_mv", "filter": "region <> 'eu'",
               "mode": "arrangement", "vnode_count": 2},
    "d.yaml": {**BASE, "filter": "qty > 5", "mode": "arrangement"},
}


class Platform:
    """The code location as a reload sees the folder, and one Dagster instance for its runs."""

    def __init__(self, tmp_path, warehouse: str) -> None:
        self.folder = tmp_path / "mvs"
        self.folder.mkdir()
        self.env = {"BACKFILL_WAREHOUSE": warehouse, "BACKFILL_MV_DIR": str(self.folder)}
        self.instance = dg.DagsterInstance.ephemeral()
        self.warehouse = warehouse

    def write(self, files: dict) -> None:
        for name, body in files.items():
            (self.folder / name).write_text(yaml.safe_dump(body))

    def reload(self) -> None:
        self.settings = load_settings(self.env)
        self.defs = build_definitions(self.settings)
        self.catalog = load_catalog(self.settings)

    def tick(self) -> list[dg.RunRequest]:
        sensor = self.defs.get_sensor_def("upstream_barrier_sensor")
        result = sensor(dg.build_sensor_context(instance=self.instance))
        return [] if isinstance(result, dg.SkipReason) else list(result)

    def run(self, request: dg.RunRequest) -> str:
        """Execute one requested barrier run and check its MV against the oracle."""
        job = self.defs.get_job_def("backfill_job")
        result = job.execute_in_process(instance=self.instance, run_config=request.run_config,
                                        tags=request.tags)
        assert result.success
        mv = request.tags["backfill/mv"]
        self.exact(mv)
        return mv

    def exact(self, mv: str) -> None:
        d = self.catalog.definition(mv)
        verdict = verify(self.spark, d, mv_tables(d, self.settings))
        assert verdict.ok, (mv, verdict.failures()[:3])

    def commit(self, seed: int, versions: int = 1) -> None:
        run_load(f"{self.warehouse}/upstream", LoadParams(seed=seed, initial_rows=400,
                                                          versions=versions,
                                                          changes_per_version=25),
                 vnode_count=VNODES)

    def waves(self, limit: int = 20) -> list[list[str]]:
        """Tick and run what each tick asks for until a tick asks for nothing."""
        out = []
        for _ in range(limit):
            requests = self.tick()
            if not requests:
                return out
            out.append(sorted(self.run(r) for r in requests))
        raise AssertionError(f"the sensor never went idle: {out}")


def _readers_apart(waves: list[list[str]], reads: dict) -> None:
    """No tick starts an MV together with an MV it reads (directly or through others)."""
    for wave in waves:
        for mv in wave:
            assert not set(reads(mv)) & set(wave), (mv, wave)


def test_chain_of_three_follows_each_commit_in_one_pass_exact_under_a_live_writer(
        spark, tmp_path, warehouse):
    p = Platform(tmp_path, warehouse)
    p.spark = spark
    p.commit(seed=11)
    p.write(CHAIN)
    p.reload()
    # first pass: the MVs reading the upstream, then each reader after the MV it reads
    assert p.waves() == [["a", "d"], ["b"], ["c"]]
    for seed in (12, 13):  # each upstream commit flows through the whole chain in one pass
        p.commit(seed)
        assert p.waves() == [["a", "d"], ["b"], ["c"]]
    # a live writer: commits land while barriers run; every barrier is still exact, no tick
    # starts a reader with the MV it reads, and once the writer stops the chain catches up
    stop, seen = threading.Event(), []

    def writer() -> None:
        seed = 100
        while not stop.is_set():
            p.commit(seed)
            seed += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(4):
            requests = p.tick()
            seen.append(sorted(p.run(r) for r in requests))
    finally:
        stop.set()
        thread.join()
    lineage = p.catalog.lineage

    def upstream_of(mv: str) -> tuple[str, ...]:
        out, todo = set(), list(lineage.reads[mv])
        while todo:
            u = todo.pop()
            out.add(u)
            todo += lineage.reads[u]
        return tuple(out)

    _readers_apart(seen, upstream_of)
    tail = p.waves()
    _readers_apart(tail, upstream_of)
    assert p.tick() == []  # caught up: every MV at its upstream's head
    for mv in "abcd":
        p.exact(mv)


def test_mv_added_and_dropped_while_the_sensor_runs(spark, tmp_path, warehouse):
    p = Platform(tmp_path, warehouse)
    p.spark = spark
    p.commit(seed=21)
    p.write({"a.yaml": CHAIN["a.yaml"], "d.yaml": CHAIN["d.yaml"]})
    p.reload()
    assert p.waves() == [["a", "d"]]
    # added: the next reload serves it and the sensor backfills it alone (the others are idle)
    p.write({"e.yaml": {**BASE, "upstream": "a/downstream_mv", "mode": "arrangement"}})
    p.reload()
    assert p.waves() == [["e"]]
    # dropped: its barriers stop; its tables stay until reset_mv_job drops them
    os.remove(p.folder / "d.yaml")
    p.reload()
    p.commit(seed=22)
    assert p.waves() == [["a"], ["e"]]
    d_tables = mv_tables(_definition(CHAIN["d.yaml"], "d"), p.settings)
    assert os.path.isdir(d_tables.mv.removeprefix("file://"))
    reset = p.defs.get_job_def("reset_mv_job")
    refused = reset.execute_in_process(
        instance=p.instance, raise_on_error=False,
        run_config={"ops": {"reset_mv": {"config": {"mv": "a", "confirm": "d"}}}})
    assert not refused.success  # a is healthy: its reset needs confirm=a, nothing deleted
    assert os.path.isdir(d_tables.mv.removeprefix("file://"))
    dropped = reset.execute_in_process(
        instance=p.instance,
        run_config={"ops": {"reset_mv": {"config": {"mv": "d", "confirm": "d"}}}})
    assert dropped.success and not os.path.exists(d_tables.mv.removeprefix("file://"))
    # a dropped MV whose output another MV still reads is refused by name
    os.remove(p.folder / "a.yaml")
    p.reload()
    still_read = p.defs.get_job_def("reset_mv_job").execute_in_process(
        instance=p.instance, raise_on_error=False,
        run_config={"ops": {"reset_mv": {"config": {"mv": "a", "confirm": "a"}}}})
    assert not still_read.success
    failure = next(e for e in still_read.all_events if e.event_type_value == "STEP_FAILURE")
    assert MVResetRefused.__name__ in str(failure.event_specific_data.error)
    assert "e still read its output" in str(failure.event_specific_data.error)
    assert os.path.isdir(mv_tables(_definition(CHAIN["a.yaml"], "a"), p.settings).mv)


def _definition(raw: dict, name: str):
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict({**raw, "name": name})
