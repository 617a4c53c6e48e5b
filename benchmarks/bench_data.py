"""The benchmarks' data: upstream tables generated once per shape (cached under BENCH_DATA,
copied per run with hard links) and the change stream a writer keeps up while a backfill runs
(a ``DmlFeeder`` in its own process). common.py re-exports these names."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import time
from collections.abc import Callable

DATA_DIR = os.environ.get("BENCH_DATA", "/tmp/bench_data")

# 8 upstream columns (+ the vnode partition column): the load generator's columns minus score.
BENCH_COLUMNS = {
    "region": "string", "id": "bigint", "name": "string", "amount": "decimal(12,2)",
    "qty": "int", "ts": "timestamp", "day": "date", "flag": "boolean",
}
PK_SHAPES = {"single": ("id",), "composite": ("region", "id")}
REGIONS = ("eu", "us", "apac", "latam", "mea")
DML_MIX = {"insert": 0.4, "update": 0.35, "delete": 0.15, "pk_change": 0.1}


def human_rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# --------------------------------------------------------------------------- data


def bench_spec(pk: str, vnode_count: int, name: str = "bench_upstream"):
    from backfill_assets.upstream.writer import UpstreamSpec

    return UpstreamSpec(name=name, columns=dict(BENCH_COLUMNS), primary_key=PK_SHAPES[pk],
                        vnode_count=vnode_count, description="benchmark upstream")


def bench_mv(pk: str, mode: str, vnode_count: int, chunk_size: int, upstream: str,
             name: str | None = None):
    """jobs/configs/mv.yaml's MV (filter + computed columns) over the benchmark upstream."""
    from backfill_assets.core.mv_definition import MVDefinition

    return MVDefinition.from_dict({
        "name": name or f"bench_{mode}", "upstream": upstream, "primary_key": list(PK_SHAPES[pk]),
        "columns": ["id", "region", "name", "amount", "qty", "ts"],
        "filter": "qty > 0 AND NOT flag",
        "computed": [{"name": "total", "expr": "amount * qty"},
                     {"name": "name_upper", "expr": "upper(name)"}],
        "mode": mode, "chunk_size": chunk_size, "vnode_count": vnode_count,
    })


def upstream_path(rows: int, pk: str, vnode_count: int) -> str:
    return os.path.join(DATA_DIR, f"up_{human_rows(rows)}_{pk}_{vnode_count}v")


def prepare_upstream(rows: int, pk: str, vnode_count: int, seed: int = 0,
                     batch: int = 2_000_000, log: Callable[[str], None] = print) -> dict:
    """Create (once; cached under BENCH_DATA) an upstream of `rows` rows, ids 0..rows-1."""
    from backfill_assets.upstream.writer import create_upstream, insert_rows
    from backfill_assets.upstream.writer.load_generator import initial_rows_table

    path = upstream_path(rows, pk, vnode_count)
    marker = os.path.join(path, "_bench_ready.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(DATA_DIR, exist_ok=True)
    spec = bench_spec(pk, vnode_count)
    t0 = time.monotonic()
    create_upstream(path, spec)
    version = 0
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        data = initial_rows_table(seed, start, n).select(list(BENCH_COLUMNS))
        version = insert_rows(path, data, spec=spec, check_existing=False)
        log(f"  upstream {human_rows(rows)} {pk}: {start + n:,}/{rows:,} rows")
    info = {"path": path, "rows": rows, "pk": pk, "vnodes": vnode_count, "version": version,
            "seconds": round(time.monotonic() - t0, 1), "bytes": dir_bytes(path),
            "files": sum(1 for _ in _parquet_files(path))}
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


class ChangeMaker:
    """Valid DML batches against a benchmark upstream whose initial ids are 0..n-1 (tracks
    deleted ids only, so it needs no scan of the table and little memory)."""

    OPS = tuple(DML_MIX)

    def __init__(self, pk: str, next_id: int, seed: int = 1) -> None:
        self.composite = pk == "composite"
        self.next_id = next_id
        self.deleted: set[int] = set()
        self.rng = random.Random(seed)
        self.weights = [DML_MIX[o] for o in self.OPS]

    def key(self, id_: int) -> tuple:
        return (REGIONS[id_ % 5], id_) if self.composite else (id_,)

    def row(self, id_: int) -> dict:
        from backfill_assets.upstream.writer.load_generator import random_row

        r = random_row(self.rng, REGIONS[id_ % 5], id_)
        r.pop("score", None)
        return r

    def _pick(self, touched: set[int]) -> int:
        while True:
            id_ = self.rng.randrange(self.next_id)
            if id_ not in self.deleted and id_ not in touched:
                return id_

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def batch(self, size: int):
        from backfill_assets.upstream.writer import DmlBatch

        touched: set[int] = set()
        ins, upd, dels, pks = [], [], [], []
        for op in self.rng.choices(self.OPS, self.weights, k=size):
            if op == "insert":
                id_ = self.new_id()
                ins.append(self.row(id_))
            elif op == "update":
                id_ = self._pick(touched)
                full = self.row(id_)
                keep = [c for c in ("name", "amount", "qty", "flag") if self.rng.random() < 0.6]
                upd.append({c: full[c] for c in ("region", "id", *keep)})
            elif op == "delete":
                id_ = self._pick(touched)
                dels.append(self.key(id_))
                self.deleted.add(id_)
            else:
                id_ = self._pick(touched)
                new = self.new_id()
                pks.append((self.key(id_), self.row(new)))
                self.deleted.add(id_)
                touched.add(new)
            touched.add(id_)
        return DmlBatch(inserts=ins, updates=upd, deletes=dels, pk_changes=pks)


def _feeder_main(conn, uri: str, pk: str, vnode_count: int, next_id: int, seed: int) -> None:
    from backfill_assets.upstream.writer import apply_dml

    spec = bench_spec(pk, vnode_count)
    maker = ChangeMaker(pk, next_id, seed)
    while True:
        n = conn.recv()
        if n is None:
            break
        t0 = time.monotonic()
        version = apply_dml(uri, maker.batch(n), spec=spec)
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


