"""The lookup-join algebra, exact, in plain Python: signed fact and dimension changes in, the
join state updated and signed joined rows out.

Why a pure reference: the Arrow version (arrow/join_state.py) and the step that will commit it
are checked against this one, and this one against a naive join from scratch. The model is
RisingWave's hash join state, for a lookup join (docs/JOINS.md):
- state: per join, the dimension rows by key and the join index (fact pks by join key); and
  the fact rows as the MV reads them, by fact pk (a dimension change must rebuild the joined
  rows of the facts that reference it without reading the upstream);
- a batch is one barrier: signed fact changes of (f0, f1] and signed dimension changes of
  (d0, d1], each netted per key (at most one -1, the row before, and one +1, the row after);
- the output is, for every fact row the batch can change (a changed fact, or a fact the
  index lists under a changed dimension key), -(its joined row at (f0, d0)) and +(its joined
  row at (f1, d1)), a pair that is equal cancelled. Summed over the batch that is exactly
  join(F1, D1) - join(F0, D0), so the order of fact and dimension changes inside the barrier
  does not matter: the same result as applying the dimension changes first (to the fact rows
  of the old index) and then the fact changes (looked up in the new dimension).
SQL's rules: a null in any join column matches nothing (a left join pads it with nulls, an
inner join drops it); a dimension row with a null key is never matched, so never kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from backfill_assets.core.errors import DimensionKeyNotUnique, InvalidJoin, JoinStateMismatch
from backfill_assets.core.join_definition import KINDS, Join


@dataclass(frozen=True)
class JoinSide:
    """One lookup join as the algebra sees it: the fact columns of the join key (``on``) and
    the dimension key columns they match, in one order, with the key's types; the dimension
    columns carried, as (name in the joined row, dimension column); inner or left."""

    on: tuple[str, ...]
    key: tuple[str, ...]
    key_types: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    kind: str

    @property
    def dimension_columns(self) -> tuple[str, ...]:
        """What the dimension state keeps per row: the key, then the carried columns."""
        return (*self.key, *(c for _, c in self.columns if c not in self.key))


@dataclass(frozen=True)
class JoinPlan:
    """The fact's pk, the fact columns the MV reads (pk and join columns among them), and the
    joins; joined rows hold the fact columns, then each join's carried names."""

    pk: tuple[str, ...]
    fact_columns: tuple[str, ...]
    sides: tuple[JoinSide, ...]

    @classmethod
    def of(cls, joins: Sequence[Join], pk: Sequence[str], fact_columns: Sequence[str],
           key_types: Sequence[Sequence[str]]) -> JoinPlan:
        """From the definition's joins, the fact pk, the fact columns the MV reads and each
        dimension key's types (in the order of its declared key)."""
        sides = tuple(JoinSide(j.fact_columns, j.key, tuple(t),
                               tuple((c.name, c.column) for c in j.columns), j.kind)
                      for j, t in zip(joins, key_types, strict=True))
        need = [*pk, *(c for s in sides for c in s.on)]
        columns = (*dict.fromkeys([*need, *fact_columns]),)
        bad = [s.kind for s in sides if s.kind not in KINDS]
        if bad:
            raise InvalidJoin(f"join kinds {bad} are not {' or '.join(KINDS)}")
        return cls(tuple(pk), columns, sides)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return (*self.fact_columns, *(n for s in self.sides for n, _ in s.columns))


@dataclass(frozen=True)
class Signed:
    """One signed change row: +1 for the row after, -1 for the row before."""

    sign: int
    row: Mapping[str, object]


@dataclass
class JoinState:
    """The whole join state, as the Delta tables will hold it (docs/JOINS.md)."""

    facts: dict[tuple, dict] = field(default_factory=dict)  # fact pk -> fact row
    dimensions: list[dict[tuple, dict]] = field(default_factory=list)  # key -> row
    index: list[dict[tuple, set[tuple]]] = field(default_factory=list)  # join key -> pks

    @classmethod
    def empty(cls, plan: JoinPlan) -> JoinState:
        return cls({}, [{} for _ in plan.sides], [{} for _ in plan.sides])


def key_of(row: Mapping[str, object] | None, columns: Sequence[str]) -> tuple | None:
    """The key ``columns`` have in ``row``, None when the row is absent or a column is null
    (SQL: a null matches nothing)."""
    if row is None:
        return None
    key = tuple(row.get(c) for c in columns)
    return None if any(v is None for v in key) else key


def joined_row(plan: JoinPlan, fact: Mapping[str, object] | None,
               dimensions: Sequence[Mapping[tuple, Mapping[str, object]] | _After]
               ) -> dict | None:
    """The joined row of one fact row against dimension rows by key (None: no row, the fact
    is absent or an inner join found no dimension row)."""
    if fact is None:
        return None
    out = {c: fact.get(c) for c in plan.fact_columns}
    for side, dims in zip(plan.sides, dimensions, strict=True):
        key = key_of(fact, side.on)
        dim = None if key is None else dims.get(key)
        if dim is None and side.kind == "inner":
            return None
        out |= {name: None if dim is None else dim.get(col) for name, col in side.columns}
    return out


def net_side(changes: Iterable[Signed], columns: Sequence[str], held: Mapping[tuple, object],
             what: str) -> dict[tuple, dict | None]:
    """Netted changes of one side: key -> the row after (None: gone). Checks them against the
    rows ``held`` before: a -1 names a held key, a +1 a key not held unless retracted;
    rows with a null key are dropped (they can match nothing)."""
    before: dict[tuple, Mapping] = {}
    after: dict[tuple, Mapping] = {}
    for c in changes:
        key = key_of(c.row, columns)
        if c.sign not in (1, -1):
            raise JoinStateMismatch(f"a signed {what} change needs sign +1 or -1: {c}")
        if key is None:
            continue
        into = before if c.sign < 0 else after
        if key in into:
            if c.sign > 0 and what == "dimension":
                raise DimensionKeyNotUnique(
                    f"the dimension inserts two rows for key {key!r} at one barrier: its "
                    "declared key is not unique; declare the dimension's real key")
            raise JoinStateMismatch(f"{what} key {key!r} changes twice in one batch: net the "
                                    "changes per key first")
        into[key] = c.row
    for key in before:
        if key not in held:
            raise JoinStateMismatch(f"the {what} change retracts key {key!r}, which the join "
                                    "state never held: reset the MV to rebuild its state")
    for key in after:
        if key in held and key not in before:
            if what == "dimension":
                raise DimensionKeyNotUnique(
                    f"the dimension inserts key {key!r}, which it already holds: its declared "
                    "key is not unique; declare the dimension's real key")
            raise JoinStateMismatch(f"fact key {key!r} is inserted while the state holds it: "
                                    "reset the MV to rebuild its state")
    return {k: (dict(after[k]) if k in after else None) for k in {**before, **after}}


def apply_batch(plan: JoinPlan, state: JoinState, fact_changes: Iterable[Signed],
                dimension_changes: Sequence[Iterable[Signed]]) -> list[tuple[int, dict]]:
    """Apply one barrier to ``state`` (in place) and return its signed joined rows (sign,
    row): what the MV's rows (keyed by fact pk) or the aggregate over them receive."""
    facts = net_side(fact_changes, plan.pk, state.facts, "fact")
    dims = [net_side(ch, s.key, state.dimensions[i], "dimension")
            for i, (s, ch) in enumerate(zip(plan.sides, dimension_changes, strict=True))]
    touched = set(facts)
    for i, changed in enumerate(dims):
        for key in changed:
            touched |= state.index[i].get(key, set())
    new_dims = [_After(old, changed) for old, changed in zip(state.dimensions, dims, strict=True)]
    out = []
    for pk in sorted(touched, key=repr):
        old_fact = state.facts.get(pk)
        new_fact = facts[pk] if pk in facts else old_fact
        before = joined_row(plan, old_fact, state.dimensions)
        after = joined_row(plan, new_fact, new_dims)
        if before == after:
            continue
        out += [(-1, before)] if before is not None else []
        out += [(1, after)] if after is not None else []
    _update(plan, state, facts, dims)
    return out


@dataclass(frozen=True)
class _After:
    """A dimension's rows after the batch, read through: the changed keys, else the held."""

    held: Mapping[tuple, Mapping[str, object]]
    changed: Mapping[tuple, Mapping[str, object] | None]

    def get(self, key: tuple) -> Mapping[str, object] | None:
        return self.changed[key] if key in self.changed else self.held.get(key)


def _update(plan: JoinPlan, state: JoinState, facts: Mapping[tuple, dict | None],
            dims: Sequence[Mapping[tuple, dict | None]]) -> None:
    """Move the changed facts in every join index, then store the new fact and dimension rows
    (the fact rows as the MV reads them, the dimension rows as the joins carry them)."""
    for pk, row in facts.items():
        old = state.facts.get(pk)
        for side, index in zip(plan.sides, state.index, strict=True):
            old_key, new_key = key_of(old, side.on), key_of(row, side.on)
            if old_key is not None:
                index[old_key].discard(pk)
                if not index[old_key]:
                    del index[old_key]
            if new_key is not None:
                index.setdefault(new_key, set()).add(pk)
        if row is None:
            state.facts.pop(pk, None)
        else:
            state.facts[pk] = {c: row.get(c) for c in plan.fact_columns}
    for side, held, changed in zip(plan.sides, state.dimensions, dims, strict=True):
        for key, row in changed.items():
            if row is None:
                held.pop(key, None)
            else:
                held[key] = {c: row.get(c) for c in side.dimension_columns}


def net_rows(signed: Iterable[tuple[int, dict]], pk: Sequence[str]) -> dict[tuple, dict | None]:
    """Signed joined rows as the row MV applies them: per fact pk, the row after (None:
    delete). A batch holds at most one -1 and one +1 per pk."""
    out: dict[tuple, dict | None] = {}
    for sign, row in signed:
        key = tuple(row[c] for c in pk)
        if sign > 0:
            out[key] = row
        else:
            out.setdefault(key, None)
    return out
