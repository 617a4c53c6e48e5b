"""The lookup-join algebra over Arrow tables: the join state tables' schemas, and one barrier of
signed fact and dimension changes turned into state writes and signed joined rows.

Why Arrow: a barrier must cost its changed rows and the fact rows they reach, never a scan of
the fact table, so every step here is an Arrow hash join or group-by over the changes and the
state rows of the keys they touch (core/join_algebra.py is the reference, with the same
semantics and the same order rule: each reached fact row gives -(its joined row before) and
+(its joined row after), equal pairs cancelled). Arrow's hash join never matches a null key,
which is SQL's rule for join columns, so join keys are joined; netting groups (a null is a
value there), as the aggregate state does.

Tables (docs/JOINS.md, RisingWave's join state):
- index, per join (`index_schema`): the join key (the fact's join columns), the fact pk, then
  every other fact column the MV reads, `vnode` of the join key; key: join key + pk; only
  facts whose join key has no null. It is the facts' only copy: a changed fact's row before
  is its pre-image in the change feed, a fact a dimension change reaches is its index row;
- dimension, per join: its declared key, the columns the join carries, `vnode` of the key;
  key: the declared key (the same vnode as the index rows it matches);
- changes in: `SIGN` (+1 row after / -1 row before), netted per key, with each side's columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.arrow.key_hash import key_vnodes
from backfill_assets.arrow.types import arrow_type
from backfill_assets.core.errors import DimensionKeyNotUnique, JoinStateMismatch
from backfill_assets.core.join_algebra import JoinPlan, JoinSide
from backfill_assets.core.names import INTERNAL_PREFIX, VNODE
from backfill_assets.core.vnode import vnodes_of

_MATCH = f"{INTERNAL_PREFIX}match"
_KEY = f"{INTERNAL_PREFIX}key_"


@dataclass
class JoinUpdate:
    """One barrier's writes and its signed joined rows. Per join (the plan's order): the
    index rows the changed facts held before and hold after (`storage.KeyedRows`' two sides:
    a key only before is deleted, an unchanged row is dropped by the write), the dimension
    upserts (whole rows) and deletes (the keys with `vnode`)."""

    index_before: list[pa.Table]
    index_after: list[pa.Table]
    dimension_upserts: list[pa.Table]
    dimension_deletes: list[pa.Table]
    joined: pa.Table


class JoinTables:
    """A join MV's state schemas and its barrier function, for a plan, the fact columns'
    types, each dimension's column types and the MV's vnode count."""

    def __init__(self, plan: JoinPlan, fact_types: Mapping[str, str],
                 dimension_types: Sequence[Mapping[str, str]], vnode_count: int):
        self.plan, self.vnode_count = plan, vnode_count
        self.fact_types = {c: fact_types[c] for c in plan.fact_columns}
        self.dim_types = [{c: t[c] for c in s.dimension_columns}
                          for s, t in zip(plan.sides, dimension_types, strict=True)]
        fields = {c: pa.field(c, arrow_type(t)) for c, t in self.fact_types.items()}
        self.fact_row_schema = pa.schema(list(fields.values()))
        self.fact_change_schema = pa.schema([pa.field(SIGN, pa.int8()), *fields.values()])
        self.index_schemas = [index_schema(s, plan.pk, fields) for s in plan.sides]
        self.dimension_schemas = [pa.schema([*_fields(t).values(), pa.field(VNODE, pa.int32())])
                                  for t in self.dim_types]
        self.dimension_change_schemas = [pa.schema([pa.field(SIGN, pa.int8()),
                                                    *_fields(t).values()])
                                         for t in self.dim_types]
        carried = [pa.field(n, arrow_type(t[c])) for s, t in zip(plan.sides, self.dim_types,
                                                                 strict=True)
                   for n, c in s.columns]
        self.joined_schema = pa.schema([pa.field(SIGN, pa.int8()), *fields.values(), *carried])

    def apply(self, index: Sequence[pa.Table], dimensions: Sequence[pa.Table],
              fact_changes: pa.Table, dimension_changes: Sequence[pa.Table]) -> JoinUpdate:
        """The writes and signed joined rows of one barrier. The state tables must hold (at
        least) the rows of the keys the changes touch: index rows of the changed dimension
        keys, dimension rows of the changed keys and of the reached facts' join keys; other
        rows are ignored. A changed fact's row before is its pre-image (the -1 change).
        Raises JoinStateMismatch / DimensionKeyNotUnique as the reference does (a retracted
        fact the index never held is refused by the index's keyed write)."""
        pk = list(self.plan.pk)
        fc = fact_changes.select(self.fact_change_schema.names).cast(self.fact_change_schema)
        f_before, f_after = _sides(fc, pk, "fact")
        dims = [self._dimension(i, d, c) for i, (d, c) in enumerate(
            zip(dimensions, dimension_changes, strict=True))]
        held, new_held, changed_keys = ([d[k] for d in dims] for k in range(3))
        reached = self.reached_facts(index, changed_keys)
        columns, kept = self.fact_row_schema.names, reached
        if reached.num_rows:  # else the keys held are the pre-images': nothing to refuse
            _check_held(f_before, f_after, pa.concat_tables([reached, f_before.select(columns)]),
                        pk, "fact")
            changed_pks = _distinct(pa.concat_tables([f_before.select(pk), f_after.select(pk)]))
            kept = _anti(reached, changed_pks, pk, pk)  # the reached facts no change names
        old_facts = pa.concat_tables([kept, f_before.select(columns)])
        new_facts = pa.concat_tables([kept, f_after.select(columns)])
        joined = _net(pa.concat_tables([
            _signed(self._joined(old_facts, held), -1),
            _signed(self._joined(new_facts, new_held), 1)]), self.joined_schema)
        index_rows = [(self._index_rows(i, f_before), self._index_rows(i, f_after))
                      for i in range(len(self.plan.sides))]
        return JoinUpdate([w[0] for w in index_rows], [w[1] for w in index_rows],
                          [d[3][0] for d in dims], [d[3][1] for d in dims], joined)

    # The reads a barrier needs, in two keyed rounds (RisingWave's lookups into its join
    # state): what `apply` reads of the state tables, and nothing more.

    def changed_keys(self, fact_changes: pa.Table, dimension_changes: Sequence[pa.Table]
                     ) -> tuple[pa.Table, list[pa.Table]]:
        """Round one, from the changes alone: the fact pks they name, and per join the
        dimension keys they name (a null key reaches nothing). Read the index rows of these
        dimension keys (by key prefix: the join key)."""
        pk = list(self.plan.pk)
        keys = []
        for side, changes, schema in zip(self.plan.sides, dimension_changes,
                                         self.dimension_schemas, strict=True):
            k = list(side.key)
            named = changes.select(k).cast(_only(schema, k))
            keys.append(_distinct(named.filter(_no_null(named, k))))
        return _distinct(fact_changes.select(pk)), keys

    def reached_facts(self, index: Sequence[pa.Table], changed_keys: Sequence[pa.Table]
                      ) -> pa.Table:
        """The fact rows (`fact_row_schema`) the index lists under a changed dimension key,
        once each (a fact reached through two joins is in both indexes, the same row)."""
        pk, out = list(self.plan.pk), self.fact_row_schema.empty_table()
        for side, rows, keys in zip(self.plan.sides, index, changed_keys, strict=True):
            listed = _semi(rows, keys, list(side.on), list(side.key))
            listed = listed.select(self.fact_row_schema.names).cast(self.fact_row_schema)
            out = pa.concat_tables([out, _anti(listed, out, pk, pk) if out.num_rows
                                    else listed])
        return out

    def lookup_keys(self, facts: pa.Table, fact_changes: pa.Table,
                    changed_keys: Sequence[pa.Table]) -> list[pa.Table]:
        """Round two: per join, the dimension keys whose rows the barrier reads: the changed
        keys and the join keys of the reached facts (``facts``: `reached_facts`) and of the
        changed ones, before and after."""
        out = []
        for side, keys, schema in zip(self.plan.sides, changed_keys, self.dimension_schemas,
                                      strict=True):
            k = list(side.key)
            parts = [keys.select(k)]
            for rows in (facts, fact_changes):
                on = rows.select(list(side.on)).filter(_no_null(rows, side.on))
                parts.append(on.rename_columns(k).cast(_only(schema, k)))
            out.append(_distinct(pa.concat_tables(parts)))
        return out

    def _dimension(self, i: int, held: pa.Table, changes: pa.Table
                   ) -> tuple[pa.Table, pa.Table, pa.Table, tuple[pa.Table, pa.Table]]:
        """(held rows, rows after, keys whose carried row changed, (upserts, deletes))."""
        side, schema = self.plan.sides[i], self.dimension_change_schemas[i]
        key, columns = list(side.key), schema.names[1:]
        dc = changes.select(schema.names).cast(schema)
        dc = dc.filter(_no_null(dc, key))  # a null key matches nothing: never kept
        before, after = _sides(dc, key, "dimension")
        held = held.select(columns)
        _check_held(before, after, held, key, "dimension")
        both = pa.concat_tables([_signed(before.select(columns), -1),
                                 _signed(after.select(columns), 1)])
        summed = both.group_by(columns, use_threads=False).aggregate([(SIGN, "sum")])
        moved = _distinct(summed.filter(pc.not_equal(summed.column(f"{SIGN}_sum"), 0))
                          .select(key))
        after = _semi(after, moved, key, key).select(columns)
        new = pa.concat_tables([_anti(held, moved, key, key), after])
        deletes = _anti(_semi(before.select(key), moved, key, key), after, key, key)
        upserts = self._with_vnode(after, key).cast(self.dimension_schemas[i])
        return held, new, moved, (upserts, self._with_vnode(deletes, key))

    def _joined(self, facts: pa.Table, dimensions: Sequence[pa.Table]) -> pa.Table:
        """Each fact row with every join's carried columns (a left join pads a missing
        dimension row with nulls; an inner join drops the fact row). Columns of the null
        type go around the joins (Arrow's join cannot carry them) and come back as nulls."""
        out = _drop_null_typed(facts.select(list(self.plan.fact_columns)))
        for i, (side, dims) in enumerate(zip(self.plan.sides, dimensions, strict=True)):
            keys = [f"{_KEY}{i}_{j}" for j in range(len(side.key))]
            right = {k: pc.cast(dims.column(c), out.schema.field(f).type)
                     for k, c, f in zip(keys, side.key, side.on, strict=True)}
            right |= {n: dims.column(c) for n, c in side.columns
                      if not pa.types.is_null(dims.schema.field(c).type)}
            right[_MATCH] = pa.repeat(pa.scalar(True), dims.num_rows)
            out = out.join(pa.table(right), keys=list(side.on), right_keys=keys,
                           join_type="left outer", coalesce_keys=True, use_threads=False)
            if side.kind == "inner":
                out = out.filter(pc.is_valid(out.column(_MATCH)))
            out = out.drop_columns([c for c in (*keys, _MATCH) if c in out.schema.names])
        return _with_nulls(out, self.joined_schema.names[1:])

    def _index_rows(self, i: int, facts: pa.Table) -> pa.Table:
        """Join ``i``'s index rows of ``facts`` (those whose join key has no null), with the
        join key's `vnode`."""
        side, schema = self.plan.sides[i], self.index_schemas[i]
        rows = facts.filter(_no_null(facts, side.on)).select(schema.names[:-1])
        return self._with_vnode(rows, side.on).cast(schema)

    def with_vnode(self, table: pa.Table, key: Sequence[str]) -> pa.Table:
        """``table`` with the `vnode` of ``key``, as the state tables hash it (a step reads
        the files of those vnodes)."""
        return self._with_vnode(table, key)

    def _with_vnode(self, table: pa.Table, key: Sequence[str]) -> pa.Table:
        """``table`` with the `vnode` of ``key`` (non-null) appended (O(rows), on the driver,
        a column at a time: arrow/key_hash.py); a join key hashes with its dimension key's
        types, so both land on one vnode."""
        types = [self.fact_types.get(k) or _type_of(self.dim_types, k) for k in key]
        vnodes = key_vnodes([table.column(k) for k in key], types, self.vnode_count)
        if vnodes is None:  # a type Arrow's text does not cover: a value at a time
            keys = list(zip(*(table.column(k).to_pylist() for k in key), strict=True))
            vnodes = pa.array(vnodes_of(keys, types, self.vnode_count), pa.int32())
        return table.append_column(VNODE, vnodes)


def index_columns(side: JoinSide, pk: Sequence[str]) -> list[str]:
    """An index row's key: the join key, then the fact pk's columns not already in it (a
    join on the fact's own key, a one-to-one enrichment, names each column once)."""
    return [*side.on, *(c for c in pk if c not in side.on)]


def index_schema(side: JoinSide, pk: Sequence[str], fact_fields: Mapping[str, pa.Field]
                 ) -> pa.Schema:
    """What an index row holds: its key (`index_columns`), then every other fact column the
    MV reads (``fact_fields``, the plan's fact columns in order), then `vnode` (of the join
    key, hashed with the dimension key's types). Why the fact columns: the index is the
    facts' only copy, so a dimension change reads its facts' rows in one keyed read."""
    key = index_columns(side, pk)
    return pa.schema([*(fact_fields[c] for c in key),
                      *(f for c, f in fact_fields.items() if c not in key),
                      pa.field(VNODE, pa.int32())])


def _only(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


def _fields(types: Mapping[str, str]) -> dict[str, pa.Field]:
    return {c: pa.field(c, arrow_type(t)) for c, t in types.items()}


def _type_of(types: Sequence[Mapping[str, str]], column: str) -> str:
    return next(t[column] for t in types if column in t)


def _no_null(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    mask = pa.repeat(pa.scalar(True), table.num_rows)
    for c in columns:
        mask = pc.and_(mask, pc.is_valid(table.column(c)))
    return mask


def _signed(table: pa.Table, sign: int) -> pa.Table:
    return table.drop_columns([c for c in (SIGN,) if c in table.schema.names]).add_column(
        0, SIGN, pa.repeat(pa.scalar(sign, pa.int8()), table.num_rows))


def _distinct(table: pa.Table) -> pa.Table:
    return table.group_by(table.schema.names, use_threads=False).aggregate([])


def _semi(table: pa.Table, keys: pa.Table, left: list[str], right: list[str]) -> pa.Table:
    """The rows of ``table`` whose ``left`` columns equal some ``right`` row of ``keys``."""
    return _match(table, keys, left, right, "left semi")


def _anti(table: pa.Table, keys: pa.Table, left: list[str], right: list[str]) -> pa.Table:
    return _match(table, keys, left, right, "left anti")


def _match(table: pa.Table, keys: pa.Table, left: list[str], right: list[str],
           how: str) -> pa.Table:
    names = [f"{_KEY}{i}" for i in range(len(right))]
    probe = pa.table({n: pc.cast(keys.column(r), table.schema.field(c).type)
                      for n, r, c in zip(names, right, left, strict=True)})
    out = _drop_null_typed(table).join(probe, keys=left, right_keys=names, join_type=how,
                                       use_threads=False)
    return _with_nulls(out, table.schema.names)


def _drop_null_typed(table: pa.Table) -> pa.Table:
    """``table`` without its columns of the null type, which Arrow's join cannot carry."""
    return table.drop_columns([f.name for f in table.schema if pa.types.is_null(f.type)])


def _with_nulls(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table``'s columns as ``names``, a missing one (of the null type) all nulls."""
    return pa.table({n: table.column(n) if n in table.schema.names else pa.nulls(
        table.num_rows) for n in names})


def _sides(changes: pa.Table, key: list[str], what: str) -> tuple[pa.Table, pa.Table]:
    """(rows before, rows after) of netted changes; refuses a key twice on one side."""
    sign = changes.column(SIGN)
    if pc.all(pc.is_in(sign, pa.array([1, -1], pa.int8()))).as_py() not in (True, None):
        raise JoinStateMismatch(f"a signed {what} change needs sign +1 or -1")
    out = []
    for s in (-1, 1):
        rows = changes.filter(pc.equal(sign, s))
        counts = rows.group_by(key, use_threads=False).aggregate([([], "count_all")])
        if pc.any(pc.greater(counts.column("count_all"), 1)).as_py():
            if s > 0 and what == "dimension":
                raise DimensionKeyNotUnique(
                    "the dimension inserts two rows for one key at one barrier: its declared "
                    "key is not unique; declare the dimension's real key")
            raise JoinStateMismatch(f"a {what} key changes twice in one batch: net the changes "
                                    "per key first")
        out.append(rows)
    return out[0], out[1]


def _check_held(before: pa.Table, after: pa.Table, held: pa.Table, key: list[str],
                what: str) -> None:
    """A -1 names a held key; a +1 a key not held unless it is retracted too."""
    if before.num_rows == 0 and after.num_rows == 0:
        return
    if _anti(before.select(key), held.select(key), key, key).num_rows:
        raise JoinStateMismatch(f"a {what} change retracts a key the join state never held: "
                                "reset the MV to rebuild its state")
    kept = _anti(_semi(after.select(key), held.select(key), key, key), before.select(key),
                 key, key)
    if kept.num_rows:
        if what == "dimension":
            raise DimensionKeyNotUnique(
                f"the dimension inserts key {kept.slice(0, 1).to_pylist()[0]}, which it "
                "already holds: its declared key is not unique; declare the dimension's "
                "real key")
        raise JoinStateMismatch("a fact key is inserted while the state holds it: reset the "
                                "MV to rebuild its state")


def _net(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Signed joined rows with equal -1/+1 pairs cancelled (grouped: a null is a value)."""
    columns = schema.names[1:]
    rows = rows.select(schema.names).cast(schema)
    summed = rows.group_by(columns, use_threads=False).aggregate([(SIGN, "sum")])
    kept = summed.filter(pc.not_equal(summed.column(f"{SIGN}_sum"), 0))
    return _signed(kept.select(columns), 1).set_column(
        0, SIGN, pc.cast(kept.column(f"{SIGN}_sum"), pa.int8()))
