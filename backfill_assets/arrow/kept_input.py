"""The kept input of an aggregate (min, max, count(DISTINCT), float sum and avg): its rows
brought forward by a batch of signed changes, and each kept aggregate's value per touched
group (arrow/aggregate_state.py's `AggregateTables` calls these; a module of its own so each
file stays one subject).

Why grouping, not joining: a null group key is a group of its own, and a join never matches
a null key (`only_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.aggregate_columns import OLD_ROWS, SIGN, value_column
from backfill_assets.core.aggregates import AggregatePlan, float_sum
from backfill_assets.core.errors import AggregateStateMismatch
from backfill_assets.core.names import INTERNAL_PREFIX, VNODE


class AggregateTables(Protocol):
    """What the kept input needs of `aggregate_state.AggregateTables` (which imports this
    module: a protocol, not an import back)."""

    plan: AggregatePlan
    pk: tuple[tuple[str, str], ...]
    group: Sequence[pa.Field]
    kept: Sequence[int]
    input_schema: pa.Schema

    @property
    def group_names(self) -> list[str]: ...

    def with_vnode(self, table: pa.Table) -> pa.Table: ...


def new_inputs(t: AggregateTables, old: pa.Table, changes: pa.Table
               ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(touched groups' kept input after the batch, input upserts, input deletes)."""
    names = [*t.group_names, *(n for n, _ in t.pk),
             *(value_column(i) for i in t.kept)]
    empty = t.input_schema.empty_table()
    if not t.kept:
        return empty.select(names), empty, empty.select([*names[:len(t.group) + len(
            t.pk)], VNODE])
    touched = changes.group_by(t.group_names, use_threads=False).aggregate([])
    old = only_groups(old.select(names), touched, t.group_names)
    mark = {"old": (old, 1), "new": (changes.select([SIGN, *names]), 0)}
    parts = []
    for table, is_old in mark.values():
        sign = table.column(SIGN) if SIGN in table.schema.names else \
            pa.repeat(pa.scalar(1, pa.int8()), table.num_rows)
        parts.append(table.select(names).append_column(SIGN, pc.cast(sign, pa.int64()))
                     .append_column(OLD_ROWS, pa.repeat(pa.scalar(is_old, pa.int64()),
                                                        table.num_rows)))
    netted = pa.concat_tables(parts).group_by(names, use_threads=False).aggregate(
        [(SIGN, "sum"), (OLD_ROWS, "sum")])
    net, was = netted.column(f"{SIGN}_sum"), netted.column(f"{OLD_ROWS}_sum")
    if pc.all(pc.is_in(net, pa.array([0, 1], pa.int64()))).as_py() is False:
        raise AggregateStateMismatch(
            "a row of the kept input is retracted or inserted twice: reset the MV to "
            "rebuild its state")
    after = netted.filter(pc.equal(net, 1)).select(names)
    keys = names[:len(t.group) + len(t.pk)]
    dupes = after.group_by(keys, use_threads=False).aggregate([([], "count_all")])
    if pc.any(pc.greater(dupes.column("count_all"), 1)).as_py():
        raise AggregateStateMismatch("an upstream row is kept twice in one group: reset "
                                     "the MV to rebuild its state")
    upserts = netted.filter(pc.and_(pc.equal(net, 1), pc.equal(was, 0))).select(names)
    dropped = netted.filter(pc.and_(pc.equal(net, 0), pc.equal(was, 1))).select(keys)
    flagged = pa.concat_tables([
        dropped.append_column("u", pa.repeat(pa.scalar(0, pa.int64()), dropped.num_rows)),
        upserts.select(keys).append_column("u", pa.repeat(pa.scalar(1, pa.int64()),
                                                          upserts.num_rows))])
    by_key = flagged.group_by(keys, use_threads=False).aggregate([("u", "max")])
    deletes = by_key.filter(pc.equal(by_key.column("u_max"), 0)).select(keys)
    return after, t.with_vnode(upserts).cast(t.input_schema), \
        t.with_vnode(deletes)


def kept_values(t: AggregateTables, kept: pa.Table) -> dict[tuple, dict[int, object]]:
    """min / max / count(DISTINCT) / float sum of each kept aggregate per touched group."""
    if not t.kept or kept.num_rows == 0:
        return {}
    aggs, nan_aggs = [], []
    for i in t.kept:
        fn = t.plan.aggregates[i].function
        how = "count_distinct" if t.plan.aggregates[i].distinct else \
            {"avg": "list", "sum": "list"}.get(fn, fn)
        aggs.append((value_column(i), how, pc.CountOptions("only_valid"))
                    if how == "count_distinct" else (value_column(i), how))
        if t.plan.input_types[i] in ("float", "double") and fn in ("min", "max"):
            nan_aggs.append(i)
    table = kept
    for i in nan_aggs:
        table = table.append_column(f"nan_{i}", pc.cast(pc.is_nan(kept.column(
            value_column(i))), pa.int64()))
    result = table.group_by(t.group_names, use_threads=False).aggregate(
        aggs + [(f"nan_{i}", "sum") for i in nan_aggs])
    out = {}
    for row in result.to_pylist():
        group = tuple(row[n] for n in t.group_names)
        values = {i: row[f"{value_column(i)}_{a[1]}"] for i, a in zip(t.kept, aggs,
                                                                       strict=True)}
        for i in t.kept:  # a float sum of the current values, correctly rounded
            if isinstance(values[i], list):
                present = [v for v in values[i] if v is not None]
                values[i] = float_sum(present) if present else None
        for i in nan_aggs:  # Spark orders NaN above every number; Arrow skips it
            if row[f"nan_{i}_sum"]:
                if t.plan.aggregates[i].function == "max" or values[i] is None:
                    values[i] = float("nan")
        out[group] = values
    return out


def only_groups(table: pa.Table, groups: pa.Table, names: list[str]) -> pa.Table:
    """The rows of ``table`` whose group key is one of ``groups``' (null keys included), by
    grouping both together rather than joining (a join never matches a null key)."""
    if table.num_rows == 0:
        return table
    marker = f"{INTERNAL_PREFIX}in"
    tagged = pa.concat_tables([
        groups.append_column(marker, pa.repeat(pa.scalar(1, pa.int64()), groups.num_rows))
        .cast(pa.schema([*table.select(names).schema, pa.field(marker, pa.int64())])),
        table.select(names).append_column(marker, pa.repeat(pa.scalar(0, pa.int64()),
                                                             table.num_rows))])
    index = pa.array(range(groups.num_rows + table.num_rows), pa.int64())
    tagged = tagged.append_column("i", index)
    per_group = tagged.group_by(names, use_threads=False).aggregate([(marker, "max"),
                                                                     ("i", "list")])
    wanted = per_group.filter(pc.equal(per_group.column(f"{marker}_max"), 1))
    rows = pc.list_flatten(wanted.column("i_list"))
    rows = pc.subtract(pc.filter(rows, pc.greater_equal(rows, groups.num_rows)),
                       groups.num_rows)
    return table.take(rows)
