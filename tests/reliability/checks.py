"""What the reliability tests compare and check (harness.py re-exports it): a table state
(MV rows as a multiset, progress rows, Delta versions, duplicate keys) and the invariant
(docs/DESIGN.md, "The invariant") on the recoverable state (``verify_recovered``), the
platform's own oracle (``assert_oracle``) and its Dagster job (``run_verify_job``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TableState:
    """What a crash test compares: MV rows, progress rows, and each table's Delta version."""

    mv: Counter
    progress: tuple
    versions: dict
    mv_duplicates: int

    @property
    def mv_rows(self) -> int:
        return sum(self.mv.values())


def _frozen(row: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def _open(uri: str, storage_options=None, version: int | None = None):
    from backfill_assets.mv.owned_tables import open_if_exists

    return open_if_exists(uri, storage_options or {}, version)


def table_versions(tables) -> dict:
    out = {}
    for name in ("mv", "replica", "progress"):
        t = _open(getattr(tables, name), tables.storage_options)
        out[name] = None if t is None else t.version()
    return out


def snapshot(tables, key_names: Sequence[str] = ("id",)) -> TableState:
    from backfill_assets.mv.owned_tables import read_rows

    mv = _open(tables.mv, tables.storage_options)
    rows = read_rows(mv).to_pylist() if mv is not None else []
    keys = Counter((r["vnode"], *(r[k] for k in key_names)) for r in rows)
    progress = _open(tables.progress, tables.storage_options)
    prows = read_rows(progress).to_pylist() if progress is not None else []
    return TableState(Counter(_frozen(r) for r in rows),
                      tuple(sorted(_frozen(r) for r in prows)),
                      table_versions(tables), sum(n - 1 for n in keys.values() if n > 1))


def assert_same_tables(expected: TableState, actual: TableState, what: str) -> int:
    """MV rows (as a multiset) and progress rows identical, no duplicate key; rows compared."""
    assert actual.mv_duplicates == 0, f"{what}: {actual.mv_duplicates} duplicate MV keys"
    missing = expected.mv - actual.mv
    extra = actual.mv - expected.mv
    assert not missing and not extra, (
        f"{what}: MV differs from the uninterrupted run: {sum(missing.values())} missing, "
        f"{sum(extra.values())} unexpected rows; e.g. missing {list(missing)[:2]}, "
        f"unexpected {list(extra)[:2]}")
    assert actual.progress == expected.progress, (
        f"{what}: progress differs from the uninterrupted run:\n"
        f"expected {_progress_text(expected.progress)}\nactual   {_progress_text(actual.progress)}")
    return expected.mv_rows + len(expected.progress)


def _progress_text(rows: tuple) -> str:
    return "; ".join(",".join(f"{k}={v}" for k, v in r if k != "vnode") for r in rows[:8])


# ------------------------------------------------------------------------- invariant check


@dataclass
class Check:
    """Result of `verify_recovered`."""

    rows_compared: int = 0
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def recovered_progress(d, tables, vnodes: Sequence[int]) -> dict:
    """vnode -> (progress, version) as the next step would recover it (NotStarted left out)."""
    from backfill_assets.core.progress import NotStarted
    from backfill_assets.mv.recovery import recover_state
    from backfill_assets.step.preflight import checked_upstream

    progress_table = _open(tables.progress, tables.storage_options)
    mv = _open(tables.mv, tables.storage_options)
    if progress_table is None or mv is None:
        return {}
    key_order = checked_upstream(tables, d, None).key_order
    state, _ = recover_state(d.name, key_order, vnodes, progress_table, mv)
    return {v: (state.committed(v), state.version(v)) for v in vnodes
            if not isinstance(state.committed(v), NotStarted)}


def verify_recovered(spark, d, tables, vnodes: Sequence[int] | None = None) -> Check:
    """The invariant after any commit: MV[k] == f(upstream@v_k, key <= pos_k) with the
    recoverable progress, and replica[k] == upstream@r_k for unfinished arrangement vnodes."""
    from backfill_assets.core.progress import Completed
    from backfill_assets.core.vnode import vnode_of
    from backfill_assets.mv.owned_tables import read_rows, txn_versions
    from backfill_assets.step.preflight import checked_upstream
    from backfill_assets.verify.oracle import verify

    vnodes = list(range(d.vnode_count)) if vnodes is None else list(vnodes)
    upstream = checked_upstream(tables, d, None)
    progress = recovered_progress(d, tables, vnodes)
    check = Check()
    verdict = verify(spark, d, tables, vnodes, progress=progress)
    check.rows_compared += verdict.rows_compared
    check.failures += [("mv", v.vnode, v.missing, v.unexpected) for v in verdict.failures()]
    replica = _open(tables.replica, tables.storage_options)
    if d.mode != "arrangement" or replica is None:
        return check
    names = [f.name for f in upstream.schema]
    at = txn_versions(replica, d.name, "replica", vnodes)
    live = [v for v in vnodes if at[v] is not None
            and not isinstance(progress.get(v, (None,))[0], Completed)]
    rows = _resolved(read_rows(replica, live), upstream.key_order).to_pylist() if live else []
    got = defaultdict(Counter)
    for row in rows:
        got[row["vnode"]][_frozen({k: row[k] for k in names})] += 1
    for version in sorted({at[v] for v in live}):
        group = {v for v in live if at[v] == version}
        want = defaultdict(Counter)
        upstream_at = _open(tables.upstream, tables.storage_options, version)
        for row in read_rows(upstream_at, None, names).to_pylist():
            k = vnode_of((row["id"],), upstream.key_types, d.vnode_count)
            if k in group:
                want[k][_frozen(row)] += 1
        for vnode in sorted(group):
            check.rows_compared += sum(want[vnode].values())
            if want[vnode] != got[vnode]:
                check.failures.append(("replica", vnode, sum((want[vnode] - got[vnode]).values()),
                                       sum((got[vnode] - want[vnode]).values())))
    return check


def _resolved(rows, key_order):
    """The replica's rows as a reader sees them: newest version per key
    (storage/rows/replica.py)."""
    from backfill_assets.storage import replica

    return replica.resolve(rows, key_order).drop_columns([replica.VERSION, replica.DELETED])


def assert_recovered_invariant(spark, d, tables, what: str) -> int:
    check = verify_recovered(spark, d, tables)
    assert check.ok, f"{what}: invariant broken (table, vnode, missing, unexpected): " \
                     f"{check.failures[:8]}"
    return check.rows_compared


def assert_oracle(spark, d, tables, what: str) -> int:
    """The platform's own oracle (progress table only): what verify_job runs."""
    from backfill_assets.verify.oracle import verify

    verdict = verify(spark, d, tables)
    bad = [(v.vnode, v.missing, v.unexpected) for v in verdict.failures()]
    assert not bad, f"{what}: oracle mismatch (vnode, missing, unexpected): {bad}"
    return verdict.rows_compared


def run_verify_job(d, warehouse: str) -> int:
    """verify_job through Dagster (execute_in_process; it shares this process's Spark)."""
    import dagster as dg

    from jobs.verify import build_verify_job
    from resources.settings import load_settings
    from resources.spark import spark_resource
    from resources.warehouse import warehouse_resource

    settings = load_settings({"BACKFILL_WAREHOUSE": warehouse,
                              "BACKFILL_VNODE_COUNT": str(d.vnode_count)})
    job = build_verify_job(d, settings)
    result = job.execute_in_process(resources={"spark": spark_resource(settings),
                                               "warehouse": warehouse_resource(settings)},
                                    instance=dg.DagsterInstance.ephemeral(),
                                    raise_on_error=False)
    assert result.success, f"verify_job failed for {d.name}"
    return int(result.output_for_node("verify_mv"))
