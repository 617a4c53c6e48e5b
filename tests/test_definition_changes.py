"""A definition that changes under existing state, names that collide, expressions that do
not parse: each refused by name before anything is written; and the documented way to rebuild
(reset_mv_job, from the command line and the UI's launchpad, which run the same job).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from backfill_assets.barrier.runner import run_barrier
from backfill_assets.core import errors
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import INTERNAL_PREFIX
from backfill_assets.mv.owned_tables import MVTables, open_if_exists
from backfill_assets.mv.reset import reset_mv
from tests.reliability import harness as H
from tests.support import assert_verified

pytestmark = pytest.mark.spark
ALL = list(range(H.VNODES))


def _built(spark, warehouse, raw_extra=None):
    live = H.orders(warehouse, 5)
    live.create(rows=40)
    raw = H.mv_raw("def_mv", "arrangement", 4, live.uri, **(raw_extra or {}))
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    run_barrier(spark, d, tables, ALL)
    live.apply(live.random_batch(4))
    return live, raw, d, tables


def _refused(spark, d, tables, error, match):
    before = H.table_versions(tables)
    with pytest.raises(error) as caught:
        run_barrier(spark, d, tables, ALL)
    assert re.search(match, str(caught.value)), str(caught.value)
    assert H.table_versions(tables) == before, "something was written before the refusal"


@pytest.mark.parametrize("edit, said", [
    ({"filter": "qty > 3"}, r"filter changed from 'qty > 2' to 'qty > 3'"),
    ({"computed": [{"name": "amount_x_qty", "expr": "amount * qty + 1"},
                   {"name": "name_upper", "expr": "upper(name)"}]},
     r"computed column 'amount_x_qty' changed"),
    ({"columns": ["id", "name", "qty"]}, r"output columns \['amount'\] removed"),
    ({"columns": ["id", "name", "amount", "qty", "day"]}, r"output columns \['day'\] added"),
])
def test_changed_definition_is_refused_and_reset_rebuilds(spark, warehouse, edit, said):
    live, raw, d, tables = _built(spark, warehouse)
    changed = H.definition({**raw, **edit})
    _refused(spark, changed, tables, errors.MVDefinitionChanged, said + r".*reset_mv_job")
    # chunk size and rate limit are controls, not the definition
    run_barrier(spark, H.definition({**raw, "chunk_size": 9}), tables, ALL)
    deleted = reset_mv(changed.name, tables, confirm=changed.name)
    assert tables.mv in deleted and tables.progress in deleted
    for _ in range(6):
        live.apply(live.random_batch(3))
        run_barrier(spark, changed, tables, ALL)
    assert_verified(spark, changed, tables)


def test_reset_needs_the_mv_name(warehouse):
    tables = MVTables.under(warehouse, "x", "up")
    with pytest.raises(errors.MVResetRefused, match="set confirm to 'x'"):
        reset_mv("x", tables, confirm="y")


def test_reset_mv_job_from_the_command_line(spark, warehouse, dagster_home):
    """`dagster job execute -j reset_mv_job -c <confirm>`: the job the UI's launchpad runs."""
    live, raw, d, tables = _built(spark, warehouse)
    config = os.path.join(warehouse, "mv.yaml")
    H.write_mv_config(config, raw)
    run_config = os.path.join(warehouse, "reset.yaml")
    with open(run_config, "w", encoding="utf-8") as f:
        f.write(f"ops:\n  reset_mv:\n    config:\n      confirm: {raw['name']}\n")
    env = H.child_env(warehouse, dagster_home=H.init_dagster_home(dagster_home),
                      mv_config=config)
    proc = subprocess.run([sys.executable, "-m", "dagster", "job", "execute", "-m",
                           "backfill_assets.definitions", "-j", "reset_mv_job", "-c", run_config],
                          cwd=H.ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}
    assert os.path.exists(live.uri)  # the upstream is never touched


@pytest.mark.parametrize("expr, what", [
    ("amount *", "does not parse"),
    ("upper(nme)", "does not work on the upstream's columns"),
])
def test_expression_errors_name_the_expression_with_sparks_detail(spark, warehouse, expr, what):
    live = H.orders(warehouse, 9)
    live.create(rows=10)
    raw = H.mv_raw("expr_mv", "arrangement", 4, live.uri,
                   computed=[{"name": "bad", "expr": expr}])
    d, tables = H.definition(raw), H.tables_of(warehouse, raw)
    with pytest.raises(errors.InvalidMVExpression) as caught:
        run_barrier(spark, d, tables, ALL)
    text = str(caught.value)
    assert f"computed column 'bad' `{expr}` {what}" in text, text
    assert re.search(r"PARSE_SYNTAX_ERROR|UNRESOLVED_COLUMN", text), text  # Spark's detail
    assert H.table_versions(tables) == {"mv": None, "replica": None, "progress": None}
    raw = H.mv_raw("expr_mv", "arrangement", 4, live.uri, filter="qty + 1")
    with pytest.raises(errors.InvalidMVExpression, match="not a boolean"):
        run_barrier(spark, H.definition(raw), tables, ALL)


def _foreign_with(warehouse: str, extra: str) -> str:
    uri = f"{warehouse}/with_{abs(hash(extra))}"
    schema = pa.schema([("id", pa.int64()), (extra, pa.string()), ("qty", pa.int32())])
    rows = [{"id": i, extra: "x", "qty": i % 5} for i in range(30)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    return uri


@pytest.mark.parametrize("column", [f"{INTERNAL_PREFIX}op", f"{INTERNAL_PREFIX.upper()}Keep",
                                    "_change_type", "_commit_version", "_commit_timestamp"])
def test_colliding_upstream_columns_are_refused_by_name(spark, warehouse, column):
    uri = _foreign_with(warehouse, column)
    d = MVDefinition.from_dict({"name": "clash", "upstream": uri, "primary_key": ["id"],
                                "columns": ["id", "qty"], "vnode_count": H.VNODES})
    tables = MVTables.under(warehouse, d.name, uri)
    with pytest.raises(errors.InvalidMVDefinition, match=re.escape(repr(column))):
        run_barrier(spark, d, tables, ALL)
    assert open_if_exists(tables.mv, {}) is None and open_if_exists(tables.replica, {}) is None


def test_unprefixed_helper_names_and_a_foreign_vnode_column_work(spark, warehouse):
    """Columns named like helper columns without the `__bf_` prefix, and the upstream's own
    `vnode` (a string
    here): carried and computed exactly; the MV's vnode is the platform's."""
    uri = f"{warehouse}/olds"
    names = ["_op", "_rn", "_keep", "_pos_every", "_bad_key", "_rank", "vnode"]
    schema = pa.schema([("id", pa.int64()), *[(n, pa.string()) for n in names]])
    rows = [{"id": i, **{n: f"{n}{i}" for n in names}} for i in range(40)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    raw = {"name": "olds", "upstream": uri, "primary_key": ["id"], "chunk_size": 6,
           "columns": ["id", *names[:-1]], "filter": "_keep <> '_keep3'",
           "computed": [{"name": "_rn2", "expr": "concat(_op, _rn)"}], "vnode_count": H.VNODES}
    d, tables = MVDefinition.from_dict(raw), MVTables.under(warehouse, "olds", uri)
    for i in range(5):
        write_deltalake(uri, pa.Table.from_pylist(
            [{"id": 100 + i, **{n: f"new{i}" for n in names}}], schema), mode="append")
        run_barrier(spark, d, tables, ALL)
        assert_verified(spark, d, tables)
    other = MVDefinition.from_dict({**raw, "name": "olds2", "columns": ["id", "vnode"]})
    with pytest.raises(errors.InvalidMVDefinition, match="computed by the platform"):
        run_barrier(spark, other, MVTables.under(warehouse, "olds2", uri), ALL)
