"""The benchmarks' data, made by the product's load generator
(``backfill_assets.upstream.writer.load_generator``): upstream tables generated once per
shape (cached under BENCH_DATA, copied per run with hard links) and the change stream a writer
keeps up while a backfill runs (a ``DmlFeeder`` in its own process, drawing from the
generator's ``Generator.over_initial_ids``: no scan of a 100M-row table). common.py re-exports
these names."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable

DATA_DIR = os.environ.get("BENCH_DATA", "/tmp/bench_data")

# the load generator's columns less score: 8 upstream columns (+ the vnode partition column)
BENCH_COLUMNS = ("region", "id", "name", "amount", "qty", "ts", "day", "flag")
PK_SHAPES = {"single": ("id",), "composite": ("region", "id")}
# rows per initial-load version: the cached upstreams' file layout (every round's figures)
LOAD_BATCH = 2_000_000


def human_rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# --------------------------------------------------------------------------- data


def bench_spec(pk: str, vnode_count: int, name: str = "bench_upstream"):
    from backfill_assets.upstream.writer import demo_spec

    return demo_spec(name, vnode_count, pk == "composite", BENCH_COLUMNS)


def bench_mv(pk: str, mode: str, vnode_count: int, chunk_size: int, upstream: str,
             name: str | None = None):
    """The platform's MV, jobs/configs/mv.yaml's columns, filter and computed columns, over
    the benchmark upstream (its other settings are the benchmark's)."""
    import yaml

    from backfill_assets.core.mv_definition import MVDefinition
    from resources.mv import DEFAULT_MV_CONFIG

    with open(DEFAULT_MV_CONFIG, encoding="utf-8") as f:
        platform = yaml.safe_load(f)
    return MVDefinition.from_dict({
        "name": name or f"bench_{mode}", "upstream": upstream, "primary_key": list(PK_SHAPES[pk]),
        **{k: platform[k] for k in ("columns", "filter", "computed")},
        "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count,
    })


def upstream_path(rows: int, pk: str, vnode_count: int) -> str:
    return os.path.join(DATA_DIR, f"up_{human_rows(rows)}_{pk}_{vnode_count}v")


def prepare_upstream(rows: int, pk: str, vnode_count: int, seed: int = 0,
                     batch: int = LOAD_BATCH, log: Callable[[str], None] = print) -> dict:
    """Create (once; cached under BENCH_DATA) an upstream of `rows` rows, ids 0..rows-1."""
    from backfill_assets.upstream.writer import LoadParams, run_load

    path = upstream_path(rows, pk, vnode_count)
    marker = os.path.join(path, "_bench_ready.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(DATA_DIR, exist_ok=True)
    params = LoadParams(seed=seed, initial_rows=rows, versions=0, columns=BENCH_COLUMNS,
                        load_batch=batch)
    done = run_load(path, params, name="bench_upstream", vnode_count=vnode_count,
                    composite_key=pk == "composite",
                    log=lambda msg: log(f"  upstream {human_rows(rows)} {pk}: {msg}"))
    info = {"path": path, "rows": rows, "pk": pk, "vnodes": vnode_count,
            "version": done.last_version, "seconds": round(done.seconds, 1),
            "bytes": dir_bytes(path), "files": sum(1 for _ in _parquet_files(path))}
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(info, f)
    return info


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in _walk_files(path))


def _walk_files(path: str):
    for folder, _, files in os.walk(path):
        for name in files:
            yield os.path.join(folder, name)


def _parquet_files(path: str):
    return (p for p in _walk_files(path) if p.endswith(".parquet"))


def work_copy(src: str, dst: str) -> str:
    """A private copy of a cached table: data files hard-linked (Delta never rewrites a data
    file in place), the log copied (so later commits never touch the cache)."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.dirname(dst), exist_ok=True)

    def link(s: str, d: str) -> None:
        if "_delta_log" in s.split(os.sep) or not s.endswith(".parquet"):
            shutil.copy2(s, d)
        else:
            os.link(s, d)

    shutil.copytree(src, dst, copy_function=link)
    return dst


# --------------------------------------------------------------------------- change stream


def change_generator(pk: str, vnode_count: int, next_id: int, seed: int = 1):
    """The load generator's DML over a cached upstream of ``next_id`` rows (ids 0..n-1), with
    the generator's default mix (inserts, updates, deletes, pk changes)."""
    from backfill_assets.upstream.writer import Generator

    return Generator.over_initial_ids(bench_spec(pk, vnode_count), seed, next_id)


def _feeder_main(conn, uri: str, pk: str, vnode_count: int, next_id: int, seed: int) -> None:
    from backfill_assets.upstream.writer import LoadParams, apply_dml

    gen, weights = change_generator(pk, vnode_count, next_id, seed), LoadParams().weights()
    batches = 0
    while True:
        n = conn.recv()
        if n is None:
            break
        t0 = time.monotonic()
        batches += 1
        version = apply_dml(uri, gen.batch(batches, n, weights), spec=gen.spec)
        conn.send({"version": version, "seconds": time.monotonic() - t0, "changes": n})


class DmlFeeder:
    """The upstream's writer, in its own process (it is another engine in production, and
    its memory must not count as the backfill driver's): one DML batch = one Delta version."""

    def __init__(self, uri: str, pk: str, vnode_count: int, next_id: int, seed: int = 1):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_feeder_main, daemon=True,
                                args=(child, uri, pk, vnode_count, next_id, seed))
        self.proc.start()
        self.seconds = 0.0
        self.batches = 0

    def apply(self, changes: int) -> dict:
        self.conn.send(changes)
        out = self.conn.recv()
        self.seconds += out["seconds"]
        self.batches += 1
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(30)


