"""The aggregate algebra over Arrow tables: the state tables' schemas, and one batch of signed
change rows turned into state, kept-input and MV upserts and deletes.

Why Arrow: a barrier's cost must follow its changed rows and touched groups, so the O(changes)
part (netting signed rows per group, per (group, pk) of the kept input, min/max/count(DISTINCT)
over the touched groups' input) runs as Arrow hash aggregations; only the O(touched groups)
finish of integer/decimal sum and avg goes through the pure reference (core/aggregates.py),
whose exact rounding it shares, and float sums, added per touched group from the kept input
with the reference's correctly rounded `float_sum` (the same value in both, whatever order
the rows are in). Running sums are added as int64 units when a bound proves that no group's
sum leaves int64 (arrow/narrow_sums.py), else as decimal256; they must fit decimal(38) when
stored. Null group keys are a group like any other: everything here groups (Arrow's hash
group-by treats null as a value) and never joins on group keys.

Tables (docs/AGGREGATES.md), each keyed and vnode-partitioned by the group key:
- state: group columns, `ROWS`, per aggregate with an argument its non-null count, per running
  sum/avg its exact sum as decimal(38, input scale), `vnode`;
- input (only when an aggregate keeps input): group columns, upstream pk, per kept aggregate
  its argument value, `vnode` (key: group columns + pk);
- changes in: `SIGN` (+1/-1), group columns, pk, per aggregate with an argument its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.aggregate_columns import (
    AT,
    OLD_ROWS,
    ROWS,
    SIGN,
    TOUCHED,
    count_column,
    sum_column,
    value_column,
)
from backfill_assets.arrow.group_keys import group_vnodes
from backfill_assets.arrow.kept_input import kept_values, new_inputs
from backfill_assets.arrow.narrow_sums import as_decimal, signed_units
from backfill_assets.arrow.running_avg import decimal_avg
from backfill_assets.arrow.types import arrow_type, decimal_units
from backfill_assets.core.aggregates import (
    Aggregate,
    AggregatePlan,
    exact_values,
)
from backfill_assets.core.errors import AggregateOverflow, AggregateStateMismatch
from backfill_assets.core.names import VNODE


@dataclass
class AggregateUpdate:
    """One batch's writes: upserts are whole rows, deletes the keys (with `vnode`)."""

    state_upserts: pa.Table
    state_deletes: pa.Table
    input_upserts: pa.Table
    input_deletes: pa.Table
    mv_upserts: pa.Table
    mv_deletes: pa.Table


class AggregateTables:
    """An aggregate MV's table schemas and its batch function, for a plan, the upstream's pk
    (name, type name) and the MV's vnode count."""

    def __init__(self, plan: AggregatePlan, pk: Sequence[tuple[str, str]], vnode_count: int):
        self.plan, self.pk, self.vnode_count = plan, tuple(pk), vnode_count
        self.group = [pa.field(n, arrow_type(t)) for n, t in zip(plan.group_names,
                                                                plan.group_types, strict=True)]
        self.args = [i for i, a in enumerate(plan.aggregates) if a.arg is not None]
        self.running = [i for i in self.args if not plan.kept[i]
                        and plan.aggregates[i].function in ("sum", "avg")]
        self.kept = [i for i, k in enumerate(plan.kept) if k]
        vnode = pa.field(VNODE, pa.int32())
        self.state_schema = pa.schema([*self.group, pa.field(ROWS, pa.int64()),
                                       *(pa.field(count_column(i), pa.int64()) for i in self.args),
                                       *(pa.field(sum_column(i), self._sum_type(i))
                                         for i in self.running), vnode])
        pk_fields = [pa.field(n, arrow_type(t)) for n, t in self.pk]
        self.input_schema = pa.schema([*self.group, *pk_fields, *(
            pa.field(value_column(i), self._input_type(i)) for i in self.kept), vnode])
        self.change_schema = pa.schema([pa.field(SIGN, pa.int8()), *self.group, *pk_fields, *(
            pa.field(value_column(i), self._input_type(i)) for i in self.args)])
        self.mv_schema = pa.schema([*self.group, *(
            pa.field(a.name, arrow_type(t)) for a, t in zip(plan.aggregates, plan.result_types,
                                                            strict=True)), vnode])

    def _input_type(self, i: int) -> pa.DataType:
        return arrow_type(self.plan.input_types[i])

    def _sum_type(self, i: int) -> pa.DataType:
        return pa.decimal128(38, self.plan.sum_scale(i))

    def _wide_type(self, i: int) -> pa.DataType:
        """Where sums are added: Arrow's decimal128 sum wraps around silently past 38
        digits, a decimal256 one cannot reach its 76 within any batch."""
        return pa.decimal256(76, self.plan.sum_scale(i))

    @property
    def group_names(self) -> list[str]:
        return [f.name for f in self.group]

    def apply(self, state: pa.Table, inputs: pa.Table, changes: pa.Table) -> AggregateUpdate:
        """The writes of one batch of signed ``changes`` given the touched groups' old
        ``state`` and kept ``inputs`` (rows of other groups are ignored). Raises
        AggregateStateMismatch / AggregateOverflow as the reference does."""
        changes = self.typed_changes(changes)
        state_rows, deletes = self.state_update(state, changes)
        kept, input_upserts, input_deletes = self.input_update(inputs, changes)
        return AggregateUpdate(state_rows, deletes, input_upserts, input_deletes,
                               self.mv_rows(state_rows, kept), deletes)

    def typed_changes(self, changes: pa.Table) -> pa.Table:
        """``changes`` in `change_schema` (its columns, in order, cast)."""
        return changes.select(self.change_schema.names).cast(self.change_schema)

    def state_update(self, state: pa.Table, changes: pa.Table, carry: Sequence[str] = ()
                     ) -> tuple[pa.Table, pa.Table]:
        """(the live touched groups' new state rows, the keys of groups gone) after typed
        ``changes`` over the touched groups' old ``state``: a function of the state table
        alone, so each table of an aggregate MV is brought forward on its own. ``carry``:
        columns of ``state`` that are a function of the group (its key text), kept in the
        new rows just before `vnode` (null for a group born here)."""
        names = [*self.state_schema.names[:-1], *carry, VNODE]
        new_state = self._new_state(state.select(names), changes, list(carry))
        live = new_state.filter(pc.greater(new_state.column(ROWS), 0))
        gone = new_state.filter(pc.and_(pc.equal(new_state.column(ROWS), 0),
                                        pc.greater(new_state.column(OLD_ROWS), 0)))
        schema = pa.schema([*self.state_schema][:-1] + [state.schema.field(c) for c in carry]
                           + [self.state_schema.field(VNODE)])
        return self._vnodes_filled(live.select(names)).cast(schema), self._vnodes_filled(
            gone.select([*self.group_names, VNODE]))

    def _vnodes_filled(self, table: pa.Table) -> pa.Table:
        """``table`` (ending with `vnode`, the old state rows' own) with the vnodes of the
        groups that had no state row computed: a group's vnode is hashed once, when born."""
        vnodes = table.column(VNODE)
        if not vnodes.null_count:
            return table
        missing = pc.is_null(vnodes)
        born = self.group_vnodes(table.filter(missing))
        return table.set_column(table.num_columns - 1, VNODE,
                                pc.replace_with_mask(vnodes.combine_chunks(),
                                                     missing.combine_chunks(), born))

    def input_update(self, inputs: pa.Table, changes: pa.Table
                     ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(the touched groups' kept input after typed ``changes``, input upserts, input
        deletes): a function of the kept-input table alone."""
        return new_inputs(self, inputs, changes)

    def state_of(self, partials: pa.Table) -> pa.Table:
        """State rows (with their `vnode`) from per-group partials aggregated elsewhere (a
        bulk snapshot in Spark): group columns, `ROWS`, the counts and exact sums."""
        rows = partials.select(self.state_schema.names[:-1])
        return self.with_vnode(rows).cast(self.state_schema)

    def input_of(self, rows: pa.Table) -> pa.Table:
        """Kept-input rows (with their `vnode`) from group columns, pk and kept values."""
        return self.with_vnode(rows.select(self.input_schema.names[:-1])).cast(
            self.input_schema)

    def mv_rows(self, state: pa.Table, kept: pa.Table) -> pa.Table:
        """The MV rows of live groups from their state rows (with `vnode`) and their whole
        kept input (any columns beyond the group, pk and kept values are ignored)."""
        names = [*self.group_names, *(n for n, _ in self.pk),
                 *(value_column(i) for i in self.kept)]
        return self._mv_rows(state.select(self.state_schema.names), kept.select(names)
                             if self.kept else kept)

    def _partials(self, changes: pa.Table, units: list[np.ndarray] | None) -> pa.Table:
        """The changes as state deltas per row: signed row count, non-null counts, sums
        (``units``: the signed int64 units of each running sum, else decimal256)."""
        sign = pc.cast(changes.column(SIGN), pa.int64())
        cols = {**{n: changes.column(n) for n in self.group_names}, ROWS: sign}
        for i in self.args:
            valid = pc.cast(pc.is_valid(changes.column(value_column(i))), pa.int64())
            cols[count_column(i)] = pc.multiply(valid, sign)
        for k, i in enumerate(self.running):
            if units is not None:
                cols[sum_column(i)] = pa.array(units[k], pa.int64())
                continue
            v = pc.fill_null(pc.cast(changes.column(value_column(i)), self._wide_type(i)),
                             pa.scalar(0, self._wide_type(i)))  # a null adds nothing
            cols[sum_column(i)] = pc.if_else(pc.greater(sign, 0), v, pc.negate(v))
        cols[OLD_ROWS] = pa.repeat(pa.scalar(0, pa.int64()), changes.num_rows)
        cols[TOUCHED] = pa.repeat(pa.scalar(1, pa.int64()), changes.num_rows)
        cols[AT] = pa.nulls(changes.num_rows, pa.int64())
        return pa.table(cols)

    def _narrow(self, old: pa.Table, changes: pa.Table
                ) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The running sums as int64 units when no group can leave int64 (narrow_sums.py)."""
        signs = changes.column(SIGN).to_numpy().astype(np.int64)
        return signed_units([old.column(sum_column(i)) for i in self.running],
                            [changes.column(value_column(i)) for i in self.running], signs,
                            [self.plan.sum_scale(i) for i in self.running])

    def _new_state(self, old: pa.Table, changes: pa.Table, carry: list[str]) -> pa.Table:
        """Old state + change deltas, summed per touched group (Arrow's group-by: no join).
        An old row's position rides along (`AT`, max over its group: null for a group born
        here), so its carried columns and `vnode` are taken from it, not aggregated."""
        narrow = self._narrow(old, changes) if self.running else None
        deltas = self._partials(changes, None if narrow is None else narrow[1])
        cols = {c: old.column(c) for c in deltas.schema.names[:len(self.group) + 1 + len(
            self.args)]}
        for k, i in enumerate(self.running):
            cols[sum_column(i)] = old.column(sum_column(i)) if narrow is None else \
                pa.array(narrow[0][k], pa.int64())
        cols |= {OLD_ROWS: old.column(ROWS), TOUCHED: pa.repeat(pa.scalar(0, pa.int64()),
                                                          old.num_rows),
                 AT: pa.array(np.arange(old.num_rows, dtype=np.int64))}
        both = pa.concat_tables([pa.table(cols).cast(deltas.schema), deltas])
        summed = both.group_by(self.group_names, use_threads=False).aggregate(
            [(c, "sum") for c in deltas.schema.names[len(self.group):-1]] + [(AT, "max")])
        summed = summed.rename_columns([c.removesuffix("_sum").removesuffix("_max")
                                        for c in summed.schema.names])
        summed = summed.filter(pc.greater(summed.column(TOUCHED), 0))
        at = summed.column(AT)
        for c in [*carry, VNODE]:  # an old group's own (null: born here)
            summed = summed.append_column(old.schema.field(c).with_nullable(True),
                                          old.column(c).take(at))
        for i in self.running:
            summed = summed.set_column(summed.schema.get_field_index(sum_column(i)),
                                       sum_column(i), self._stored_sum(summed, i, narrow))
        rows = summed.column(ROWS)
        bad = pc.less(rows, 0)
        for i in self.args:
            c = summed.column(count_column(i))
            bad = pc.or_(bad, pc.or_(pc.less(c, 0), pc.greater(c, rows)))
        if pc.any(bad).as_py():
            raise AggregateStateMismatch(
                "the changes retract rows the aggregate state never held (a group's count "
                "would fall below zero): reset the MV to rebuild its state")
        return summed

    def _stored_sum(self, summed: pa.Table, i: int, narrow: object) -> pa.Array:
        """Running sum i of ``summed`` in the state's decimal(38, s): from int64 units (they
        fit), or the decimal256 sum checked to fit 38 digits."""
        if narrow is not None:
            return as_decimal(summed.column(sum_column(i)), self._sum_type(i))
        try:
            return pc.cast(summed.column(sum_column(i)), self._sum_type(i))
        except pa.ArrowInvalid as e:
            raise AggregateOverflow(
                f"the sum of {self.plan.aggregates[i].text} in a group leaves 38 digits, "
                "beyond every Spark decimal (Spark fails too): aggregate a rescaled "
                "expression") from e

    def _mv_rows(self, state: pa.Table, kept: pa.Table) -> pa.Table:
        """The MV rows of the live touched groups, in Spark's types, a column at a time
        (O(touched groups); a bulk finishes every group here)."""
        kept_values_ = kept_values(self, kept)
        groups = list(zip(*(state.column(n).to_pylist() for n in self.group_names),
                          strict=True)) if self.kept else []
        columns: list[object] = [state.column(n) for n in self.group_names]
        try:
            for i, a in enumerate(self.plan.aggregates):
                counts = state.column(count_column(i) if a.arg is not None else ROWS)
                if i in self.running:
                    values = self._running_values(state, i, counts)
                elif i in self.kept:
                    values = [self._kept_value(a, kept_values_.get(g, {}).get(i), count)
                              for g, count in zip(groups, counts.to_pylist(), strict=True)]
                else:
                    values = counts
                field = self.mv_schema.field(a.name)
                columns.append(values.cast(field.type) if isinstance(values, (
                    pa.ChunkedArray, pa.Array)) else pa.array(values, field.type))
            columns.append(state.column(VNODE))
            return pa.Table.from_arrays(columns, schema=self.mv_schema)
        except (pa.ArrowInvalid, OverflowError) as e:
            raise AggregateOverflow(f"an aggregate leaves its Spark type: {e}") from e

    def _running_values(self, state: pa.Table, i: int, counts: pa.ChunkedArray
                        ) -> pa.ChunkedArray | list[object]:
        """Running aggregate i of every group: a sum is its exact state sum in the result's
        type (Arrow's checked cast, null over no input), an avg Spark's rounding per group;
        a sum the cast refuses goes through the reference, which names the overflow."""
        sums = state.column(sum_column(i))
        if self.plan.aggregates[i].function == "sum":
            result = self.mv_schema.field(self.plan.aggregates[i].name).type
            try:
                return pc.if_else(pc.equal(counts, 0), pa.scalar(None, result),
                                  sums.cast(result))
            except pa.ArrowInvalid:
                pass
        elif pa.types.is_decimal128(result := self.mv_schema.field(
                self.plan.aggregates[i].name).type):
            fast = decimal_avg(sums, counts, self.plan.sum_scale(i), result)
            if fast is not None:  # numpy's HALF_UP while every sum fits int64
                return fast
        return exact_values(self.plan, i, decimal_units(sums), counts.to_pylist())

    @staticmethod
    def _kept_value(a: Aggregate, value: object, count: int) -> object:
        """A kept aggregate's MV value from its value over the kept input (avg: its sum)."""
        if a.function == "avg" and count:
            value = value / float(count)  # type: ignore[operator]
        return (value or 0) if a.distinct else value if count else None

    def with_vnode(self, table: pa.Table) -> pa.Table:
        """``table`` with the `vnode` of its group key appended."""
        return table.append_column(VNODE, self.group_vnodes(table))

    def group_vnodes(self, table: pa.Table) -> pa.Array:
        """The vnode of each row's group (`group_keys.group_vnodes`)."""
        return group_vnodes([table.column(n) for n in self.group_names],
                            list(self.plan.group_types), self.vnode_count)
