"""The pure Arrow half of the join MV's bulk by tasks (join/bulk_tasks.py): a lookup join of a
slice of fact rows against whole dimensions held in memory, the index rows it yields, and
the partial aggregates of the joined rows.

Why a lookup by position rather than Arrow's hash join: each dimension is one table shared
by every task of this process, and a fact row meets at most one of its rows (the declared key
is unique, checked before). The position of each fact's dimension row (``pc.index_in``, or a
join on row numbers for a composite key) gives the carried columns by ``take``, keeps the
fact rows in their order and tells matched from unmatched rows: a left join pads (``take`` of
a null position is null), an inner join drops, a null key matches nothing (SQL's rule, the
algebra's, docs/JOINS.md). It also gives each index row its vnode for free: the join key's
vnode is its dimension row's, computed once per dimension row; only keys no dimension row
holds are hashed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.aggregate.projection import Projection, group_column
from backfill_assets.arrow.aggregate_state import ROWS, count_column, sum_column, value_column
from backfill_assets.arrow.join_state import JoinTables
from backfill_assets.core.errors import AggregateOverflow
from backfill_assets.core.names import INTERNAL_PREFIX, VNODE

_FACT_ROW, _DIM_ROW = f"{INTERNAL_PREFIX}fact_row", f"{INTERNAL_PREFIX}dim_row"


@dataclass(frozen=True)
class Lookup:
    """One join's dimension as the tasks read it: its kept rows (key, carried columns, the
    key's `vnode`), non-null keys, each key once."""

    on: tuple[str, ...]
    key: tuple[str, ...]
    rows: pa.Table

    def positions(self, facts: pa.Table) -> pa.Array:
        """Per fact row, the row of its dimension row in ``rows``, or null (no match; a null
        in any join column matches nothing)."""
        if len(self.on) == 1:
            return pc.index_in(facts.column(self.on[0]).combine_chunks(),
                               value_set=self.rows.column(self.key[0]).combine_chunks(),
                               skip_nulls=True)
        left = facts.select(list(self.on)).append_column(
            _FACT_ROW, pa.array(np.arange(facts.num_rows, dtype=np.int64)))
        right = self.rows.select(list(self.key)).append_column(
            _DIM_ROW, pa.array(np.arange(self.rows.num_rows, dtype=np.int64)))
        met = left.join(right, keys=list(self.on), right_keys=list(self.key),
                        join_type="inner", use_threads=False)
        where = np.full(facts.num_rows, -1, dtype=np.int64)
        where[met.column(_FACT_ROW).to_numpy()] = met.column(_DIM_ROW).to_numpy()
        return pa.array(where, mask=where < 0)


def joined_rows(jt: JoinTables, facts: pa.Table, lookups: Sequence[Lookup],
                positions: Sequence[pa.Array]) -> pa.Table:
    """The fact rows (with their `vnode`) with every join's carried columns, as the
    algebra's joined rows: a left join pads, an inner join drops the fact row."""
    out, keep = facts, None
    for side, lookup, pos in zip(jt.plan.sides, lookups, positions, strict=True):
        for name, column in side.columns:
            out = out.append_column(name, lookup.rows.column(column).take(pos))
        if side.kind == "inner":
            matched = pc.is_valid(pos)
            keep = matched if keep is None else pc.and_(keep, matched)
    return out if keep is None else out.filter(keep)


def index_rows(jt: JoinTables, i: int, facts: pa.Table, lookup: Lookup, pos: pa.Array,
               names: Sequence[str]) -> pa.Table:
    """Join ``i``'s index rows of ``facts``: every fact with a non-null join key (columns
    ``names``), with the join key's vnode (its dimension row's; hashed here for a key no
    dimension row holds)."""
    on = list(jt.plan.sides[i].on)
    keyed = pc.is_valid(facts.column(on[0]).combine_chunks())
    for c in on[1:]:
        keyed = pc.and_(keyed, pc.is_valid(facts.column(c).combine_chunks()))
    rows = facts.filter(keyed).drop_columns([VNODE])
    pos = pos.filter(keyed)
    vnodes = lookup.rows.column(VNODE).combine_chunks().take(pos)
    missing = pc.is_null(vnodes)
    if pc.any(missing).as_py():
        hashed = jt.with_vnode(rows.filter(missing).select(on), on).column(VNODE)
        vnodes = pc.replace_with_mask(vnodes, missing, hashed.combine_chunks())
    rows = rows.append_column(VNODE, pc.cast(vnodes, pa.int32()))
    return rows.select(list(names))


def partials(p: Projection, values: pa.Table) -> pa.Table:
    """Per group of stage two's ``values`` (group columns under stage two's names): the row
    count, each argument's non-null count and each running sum in decimal256 (no sum of a
    slice can overflow it): what `aggregate.projection.bulk_partials` asks Spark for."""
    t = p.tables
    groups = [group_column(i) for i in range(len(p.plan.group_names))]
    cols = {g: values.column(g) for g in groups}
    cols[ROWS] = pa.repeat(pa.scalar(1, pa.int64()), values.num_rows)
    aggs = [(ROWS, "sum")]
    for i in t.args:
        cols[count_column(i)] = values.column(value_column(i))
        aggs.append((count_column(i), "count"))
    for i in t.running:
        cols[sum_column(i)] = pc.cast(values.column(value_column(i)),
                                      pa.decimal256(76, p.plan.sum_scale(i)))
        aggs.append((sum_column(i), "sum"))
    out = pa.table(cols).group_by(groups, use_threads=False).aggregate(aggs)
    return out.rename_columns([c.removesuffix("_sum") if c.endswith("_sum")
                               else c.removesuffix("_count") for c in out.column_names])


def merged_partials(p: Projection, parts: Sequence[pa.Table]) -> pa.Table:
    """The tasks' partials summed per group, as the aggregate's state rows (with `vnode`);
    a sum past 38 digits is `AggregateOverflow` (Spark's GROUP BY fails too)."""
    t = p.tables
    if not parts:  # an empty fact table: no group
        return t.state_schema.empty_table()
    groups = [group_column(i) for i in range(len(p.plan.group_names))]
    both = pa.concat_tables(parts)
    sums = [c for c in both.column_names if c not in groups]
    out = both.group_by(groups, use_threads=False).aggregate([(c, "sum") for c in sums])
    out = out.rename_columns([c.removesuffix("_sum") for c in out.column_names])
    for i in t.running:
        total = pc.fill_null(out.column(sum_column(i)),
                             pa.scalar(0, out.schema.field(sum_column(i)).type))
        try:
            narrow = pc.cast(total, pa.decimal128(38, p.plan.sum_scale(i)))
        except pa.ArrowInvalid as e:
            raise AggregateOverflow(
                f"the sum of {p.plan.aggregates[i].text} in a group leaves 38 digits, beyond "
                "every Spark decimal (Spark fails too): aggregate a rescaled expression") from e
        out = out.set_column(out.schema.get_field_index(sum_column(i)), sum_column(i), narrow)
    renames = {group_column(i): n for i, n in enumerate(p.plan.group_names)}
    return t.state_of(out.rename_columns([renames.get(c, c) for c in out.column_names]))
