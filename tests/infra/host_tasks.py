"""Small jobs the host tests run ON a host: ``python -m tests.infra.host_tasks <task> ...``.

Why a module: the test process is on no host and cannot reach the S3 server; every read or
write of the store goes through a process on a host, with the store's settings in its
environment (AWS_* variables, as a deployment sets them). Each task prints one JSON line.

bucket NAME              create the bucket
load URI PARAMS_JSON     the load generator (LoadParams fields; vnode_count too)
objects PREFIX           the object keys under PREFIX
append URI PARAMS_JSON   ``count`` new keys (ids from ``start``) appended in ``versions``
                         versions: changes over a large upstream without the DML's scan of
                         every live key (the load generator's ``initial_rows_table`` rows)
counts UPSTREAM MV WHERE rows and sum of ids of the upstream's rows WHERE selects and
                         of the MV, each counted by delta-rs's query engine (streamed: a
                         100M-row check needs no rows in memory)
compare UPSTREAM MV      the MV against its upstream's latest version, recomputed here with
                         pyarrow alone (the default MV of jobs/configs/mv.yaml: filter
                         ``qty > 0 AND NOT flag``, ``total = amount * qty``,
                         ``name_upper = upper(name)``), an oracle independent of Spark
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections import Counter
from decimal import Decimal

import pyarrow as pa

OPTION_NAMES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
                "AWS_ALLOW_HTTP")
MV_COLUMNS = ("id", "region", "name", "amount", "qty", "ts", "total", "name_upper")


def options() -> dict[str, str]:
    return {k: os.environ[k] for k in OPTION_NAMES if k in os.environ}


def bucket(name: str) -> dict:
    req = urllib.request.Request(f"{os.environ['AWS_ENDPOINT_URL']}/{name}", method="PUT")
    urllib.request.urlopen(req, timeout=30).close()
    return {"bucket": name}


def load(uri: str, params_json: str) -> dict:
    from backfill_assets.upstream.writer import LoadParams, run_load

    raw = json.loads(params_json)
    vnodes = raw.pop("vnode_count")
    summary = run_load(uri, LoadParams(**raw), vnode_count=vnodes, storage_options=options())
    return {"last_version": summary.last_version, "rows": summary.row_count}


def append(uri: str, params_json: str) -> dict:
    from backfill_assets.upstream.writer import initial_rows_table, insert_rows, read_upstream_spec

    raw = json.loads(params_json)
    spec = read_upstream_spec(uri, options())
    start, per = raw["start"], raw["count"] // raw["versions"]
    version = None
    for i in range(raw["versions"]):
        rows = initial_rows_table(raw["seed"], start + i * per, per)
        version = insert_rows(uri, rows.select(list(spec.columns)), spec=spec,
                              storage_options=options(), check_existing=False)
    return {"last_version": version, "rows": per * raw["versions"]}


def objects_under(prefix: str) -> dict:
    from backfill_assets.storage import objects

    return {"keys": sorted(o.uri[len(prefix):].lstrip("/")
                           for o in objects.list_prefix(prefix, options()))}


def expected_rows(upstream: pa.Table) -> list[tuple]:
    """The MV's rows recomputed from the upstream's rows, in plain Python (SQL's three-valued
    logic: a row whose filter is null is not kept)."""
    out = []
    for r in upstream.to_pylist():
        if not (r["qty"] is not None and r["qty"] > 0 and r["flag"] is False):
            continue
        total = None if r["amount"] is None else r["amount"] * r["qty"]
        upper = None if r["name"] is None else r["name"].upper()
        out.append(_canon((r["id"], r["region"], r["name"], r["amount"], r["qty"], r["ts"],
                           total, upper)))
    return out


def _canon(row: tuple) -> tuple:
    """Decimals compared by value (the MV's total has its own scale)."""
    return tuple(v.normalize() if isinstance(v, Decimal) else v for v in row)


def _rows(table) -> pa.Table:
    """Every row of a Delta table through delta-rs's own query engine (it applies deletion
    vectors, which the MV has and pyarrow's dataset reader refuses)."""
    from deltalake import QueryBuilder

    return pa.table(QueryBuilder().register("t", table).execute("select * from t").read_all())


def compare(upstream_uri: str, mv_uri: str) -> dict:
    from deltalake import DeltaTable

    opts = options()
    upstream = DeltaTable(upstream_uri, storage_options=opts)
    mv = _rows(DeltaTable(mv_uri, storage_options=opts)).select(list(MV_COLUMNS))
    want = Counter(expected_rows(_rows(upstream)))
    got = Counter(_canon(tuple(r[c] for c in MV_COLUMNS)) for r in mv.to_pylist())
    keys = Counter(mv["id"].to_pylist())
    return {"upstream_version": upstream.version(), "expected_rows": sum(want.values()),
            "mv_rows": mv.num_rows, "missing": sum((want - got).values()),
            "unexpected": sum((got - want).values()),
            "duplicate_keys": sum(n - 1 for n in keys.values() if n > 1)}


def counts(upstream_uri: str, mv_uri: str, where: str) -> dict:
    from deltalake import DeltaTable, QueryBuilder

    def one(uri: str, cond: str) -> dict:
        table = DeltaTable(uri, storage_options=options())
        got = pa.table(QueryBuilder().register("t", table).execute(
            f"select count(*) as n, sum(id) as ids from t where {cond}").read_all()).to_pylist()
        return {"version": table.version(), **got[0]}

    return {"upstream": one(upstream_uri, where), "mv": one(mv_uri, "true")}


TASKS = {"bucket": bucket, "load": load, "append": append, "objects": objects_under,
         "compare": compare, "counts": counts}

if __name__ == "__main__":
    print(json.dumps(TASKS[sys.argv[1]](*sys.argv[2:]), default=str), flush=True)
