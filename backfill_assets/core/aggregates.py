"""The aggregate algebra, exact, in plain Python: signed rows in, per-group state and MV rows out.

Why a pure reference: the vectorised version (arrow/aggregate_state.py) and the step that will
commit it are checked against this one, and this one against a naive GROUP BY. The model is
RisingWave's HashAgg (docs/AGGREGATES.md):
- a change enters as signed rows: +1 for an insert or a post-image, -1 for a delete or a
  pre-image (an update that moves a row to another group is -1 in the old, +1 in the new);
- a group's state holds a hidden row count (the group exists while it is above zero), and per
  aggregate the count of non-null inputs and, for integer and decimal sum/avg, the exact sum
  (an int of the decimal's unscaled units: never rounded, never overflowing in state);
- min, max, count(DISTINCT) and float sum/avg are recomputed for each touched group from the
  group's kept input (group key, upstream pk, value): deleting the current extreme yields the
  next one, and a float sum is a function of the current values, not of the history;
- the MV row of a group is `finalize`d with Spark's result types and rounding.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from backfill_assets.core.aggregate_definition import (
    INTEGERS,
    Aggregate,
    GroupColumn,
    canonical_type,
    check_input_types,
    decimal_of,
    needs_input,
)
from backfill_assets.core.errors import AggregateOverflow, AggregateStateMismatch
from backfill_assets.core.vnode import SEPARATOR, canonical_value_text, check_vnode_count

_BIGINT = 2**63


@dataclass(frozen=True)
class AggregatePlan:
    """An aggregate MV's group columns and aggregates with their input and result types."""

    group_names: tuple[str, ...]
    group_types: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    input_types: tuple[str, ...]  # "" for count(*)
    result_types: tuple[str, ...]

    @classmethod
    def of(cls, group_by: Sequence[GroupColumn], aggregates: Sequence[Aggregate],
           types: Mapping[str, str]) -> AggregatePlan:
        """From the definition and the analysed types (group column or aggregate name ->
        type of its expression / argument); raises InvalidAggregate like the definition."""
        out = check_input_types(tuple(group_by), tuple(aggregates), types)
        return cls(tuple(g.name for g in group_by), tuple(out[g.name] for g in group_by),
                   tuple(aggregates),
                   tuple(canonical_type(types.get(a.name, "")) if a.arg else ""
                         for a in aggregates),
                   tuple(out[a.name] for a in aggregates))

    @property
    def kept(self) -> tuple[bool, ...]:
        """Per aggregate: recomputed from kept input (True) or running state (False)."""
        return tuple(needs_input(a, t) for a, t in zip(self.aggregates, self.input_types,
                                                       strict=True))

    @property
    def keeps_input(self) -> bool:
        return any(self.kept)

    def sum_scale(self, i: int) -> int:
        """The scale of aggregate i's exact running sum (0 for integers)."""
        dec = decimal_of(self.input_types[i])
        return dec[1] if dec else 0


@dataclass(frozen=True)
class SignedRow:
    """One row entering the aggregate: sign +1 / -1, its group key, its upstream pk, and one
    value per aggregate (its evaluated argument; None for count(*))."""

    sign: int
    group: tuple
    pk: tuple
    values: tuple


@dataclass(frozen=True)
class GroupState:
    """A group's running state: the hidden row count, per aggregate the non-null input count
    and (integer / decimal sum and avg) the exact sum in unscaled units, else None."""

    rows: int
    counts: tuple[int, ...]
    sums: tuple[int | None, ...]


@dataclass
class BatchResult:
    """What one batch does to the touched groups: their new states (None: the group is gone),
    their new kept input, and the MV's upserts (group -> output values) and deletes."""

    states: dict[tuple, GroupState | None] = field(default_factory=dict)
    inputs: dict[tuple, dict[tuple, tuple]] = field(default_factory=dict)
    upserts: dict[tuple, tuple] = field(default_factory=dict)
    deletes: set[tuple] = field(default_factory=set)


def unscaled(value: object, scale: int) -> int:
    """An int or Decimal as an exact int of 10**-scale units (no context rounding)."""
    if isinstance(value, int):
        return value * 10**scale
    sign, digits, exp = Decimal(value).as_tuple()  # type: ignore[arg-type]
    n = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    shift = int(exp) + scale
    if shift >= 0:
        return n * 10**shift
    q, r = divmod(n, 10**-shift)
    if r:
        raise AggregateStateMismatch(f"{value!r} has more than {scale} fraction digits")
    return q


def as_decimal(units: int, scale: int) -> Decimal:
    """The exact Decimal of ``units`` * 10**-scale."""
    return Decimal(f"{units}E-{scale}")


def apply_batch(plan: AggregatePlan, states: Mapping[tuple, GroupState],
                inputs: Mapping[tuple, Mapping[tuple, tuple]],
                batch: Iterable[SignedRow]) -> BatchResult:
    """The new state and MV changes of the groups ``batch`` touches. ``states`` and
    ``inputs`` hold (at least) those groups' old state and kept input (pk -> kept values).
    Raises AggregateStateMismatch when the batch retracts what the state never held and
    AggregateOverflow when an output leaves its Spark type."""
    n, kept = len(plan.aggregates), plan.kept
    delta: dict[tuple, list] = {}
    moves: dict[tuple, int] = {}  # (group, pk, kept values) -> net sign
    for r in batch:
        if r.sign not in (1, -1) or len(r.values) != n:
            raise AggregateStateMismatch(f"a signed row needs sign +1/-1 and {n} values: {r}")
        d = delta.setdefault(r.group, [0, [0] * n, [0] * n])
        d[0] += r.sign
        for i, v in enumerate(r.values):
            if plan.aggregates[i].arg is None or v is None:
                continue
            d[1][i] += r.sign
            if not kept[i] and plan.aggregates[i].function in ("sum", "avg"):
                d[2][i] += r.sign * unscaled(v, plan.sum_scale(i))
        if plan.keeps_input:
            k = (r.group, r.pk, tuple(v for v, keep in zip(r.values, kept, strict=True) if keep))
            moves[k] = moves.get(k, 0) + r.sign
    out = BatchResult()
    for group, (rows, counts, sums) in delta.items():
        old = states.get(group) or GroupState(0, (0,) * n, (None,) * n)
        new_rows = old.rows + rows
        new_counts = tuple(a + b for a, b in zip(old.counts, counts, strict=True))
        new_sums = tuple(None if kept[i] or plan.aggregates[i].function not in ("sum", "avg")
                         else (old.sums[i] or 0) + sums[i] for i in range(n))
        if new_rows < 0 or min(new_counts, default=0) < 0 or any(
                c > new_rows for c in new_counts):
            raise AggregateStateMismatch(
                f"group {group!r} would hold {new_rows} rows: the changes retract rows the "
                "aggregate state never held; reset the MV to rebuild its state")
        if new_rows or old.rows:  # a group born and gone inside the batch never existed
            out.states[group] = GroupState(new_rows, new_counts, new_sums) if new_rows else None
    if plan.keeps_input:
        out.inputs = _moved_inputs(inputs, moves, set(delta))
    for group, state in out.states.items():
        if state is None:
            if out.inputs.get(group):
                raise AggregateStateMismatch(f"group {group!r} has no rows but kept input")
            out.deletes.add(group)
        else:
            out.upserts[group] = finalize(plan, state, list(out.inputs.get(group, {}).values()))
    return out


def _moved_inputs(inputs: Mapping[tuple, Mapping[tuple, tuple]], moves: Mapping[tuple, int],
                  touched: set[tuple]) -> dict[tuple, dict[tuple, tuple]]:
    """The touched groups' kept input after the batch: net retractions first, then net
    insertions (an update inside one group retracts and re-inserts the same pk)."""
    out = {g: dict(inputs.get(g, {})) for g in touched}
    for (group, pk, values), sign in sorted(moves.items(), key=lambda kv: kv[1]):
        rows = out[group]
        if sign == -1 and pk in rows and _same(rows[pk], values):
            del rows[pk]
        elif sign == 1 and pk not in rows:
            rows[pk] = values
        elif sign != 0:
            raise AggregateStateMismatch(
                f"row {pk!r} of group {group!r} is retracted or inserted {abs(sign)} times "
                "against the kept input: reset the MV to rebuild its state")
    return out


def _same(a: tuple, b: tuple) -> bool:
    """Equal kept values, NaN equal to NaN (a retraction carries the value it retracts)."""
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                          and math.isnan(y)) for x, y in zip(a, b, strict=True))


def finalize(plan: AggregatePlan, state: GroupState, kept_rows: Sequence[tuple]) -> tuple:
    """A live group's output values, in Spark's types (``kept_rows``: its kept input)."""
    out, column = [], 0
    for i, a in enumerate(plan.aggregates):
        values = None
        if plan.kept[i]:
            values = [r[column] for r in kept_rows if r[column] is not None]
            column += 1
        out.append(_value(plan, i, a, state, values))
    return tuple(out)


def _value(plan: AggregatePlan, i: int, a: Aggregate, state: GroupState,
           values: list | None) -> object:
    if a.function == "count":
        if a.arg is None:
            return state.rows
        return len(set(values or ())) if a.distinct else state.counts[i]
    if state.counts[i] == 0:
        return None  # sum, avg, min, max of no non-null value: NULL, as Spark
    if a.function in ("min", "max"):
        key = _float_order if plan.input_types[i] in ("float", "double") else None
        return (min if a.function == "min" else max)(values, key=key)  # type: ignore[type-var]
    if values is not None:  # float sum / avg over the current values
        total = float_sum(values)
        return total if a.function == "sum" else total / float(state.counts[i])
    return exact_value(plan, i, state.sums[i] or 0, state.counts[i])


def exact_value(plan: AggregatePlan, i: int, units: int, count: int) -> object:
    """Aggregate i (an integer or decimal sum / avg) of a group whose running state is the
    exact sum ``units`` over ``count`` non-null inputs, in Spark's type and rounding."""
    return exact_values(plan, i, [units], [count])[0]


def exact_values(plan: AggregatePlan, i: int, units: Sequence[int], counts: Sequence[int]
                 ) -> list[object]:
    """`exact_value` of many groups, aggregate i's types resolved once (a bulk finishes
    every group of the MV at once)."""
    a, scale, dec = plan.aggregates[i], plan.sum_scale(i), decimal_of(plan.result_types[i])
    integers = plan.input_types[i] in INTEGERS
    return [_exact(a, integers, scale, dec, u, c) for u, c in zip(units, counts, strict=True)]


def _exact(a: Aggregate, integers: bool, scale: int, dec: tuple[int, int] | None, units: int,
           count: int) -> object:
    if count == 0:
        return None
    if a.function == "sum":
        if integers:
            if not -_BIGINT <= units < _BIGINT:
                raise AggregateOverflow(
                    f"sum {a.name!r} is {units}, beyond bigint (Spark fails too): sum "
                    f"CAST({a.arg} AS decimal(38,0)) instead")
            return units
        _fits(a, units, dec)  # type: ignore[arg-type]
        return as_decimal(units, scale)
    if dec is None:  # avg over integers: Spark divides the doubles of sum and count
        return float(units) / float(count)
    # Spark 4.2 divides to scale 39 rounding DOWN, then rounds HALF_UP to the result scale
    # (<= 38): the truncation never crosses a half of the result scale, so this one exact
    # HALF_UP division of integers gives the same value
    numerator, sign = abs(units) * 10 ** (dec[1] - scale), -1 if units < 0 else 1
    quotient, remainder = divmod(numerator, count)
    rounded = sign * (quotient + (1 if 2 * remainder >= count else 0))
    _fits(a, rounded, dec)
    return as_decimal(rounded, dec[1])


def _fits(a: Aggregate, units: int, dec: tuple[int, int]) -> None:
    if abs(units) >= 10 ** dec[0]:
        raise AggregateOverflow(
            f"{a.function} {a.name!r} does not fit decimal({dec[0]},{dec[1]}), its Spark type "
            "(Spark fails too): aggregate a narrower or rescaled expression")


def _float_order(v: float) -> tuple[bool, float]:
    """Spark's order of doubles: NaN above every number."""
    return (math.isnan(v), 0.0 if math.isnan(v) else v)


def float_sum(values: Sequence[float]) -> float:
    """The correctly rounded sum of doubles (IEEE for NaN and infinities): a function of the
    values alone, within (n-1)·2^-53·Σ|v| of any order Spark may add them in."""
    if any(math.isnan(v) for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values or -math.inf in values:
        return math.inf if math.inf in values else -math.inf
    try:
        return math.fsum(values)
    except OverflowError:
        # a partial sum left double's range: halves add without overflow (exactly, but for
        # subnormals), and doubling back gives the sum or the infinity it rounds to
        return math.fsum(v / 2 for v in values) * 2


def group_vnode(group: tuple, types: Sequence[str], vnode_count: int) -> int:
    """The vnode of a group key: the platform's key hash (core/vnode.py), a null group column
    read as the empty text (Spark: ``COALESCE(<canonical text>, '')``)."""
    check_vnode_count(vnode_count)
    text = SEPARATOR.join("" if v is None else canonical_value_text(v, t)
                          for v, t in zip(group, types, strict=True))
    return zlib.crc32(text.encode("utf-8")) % vnode_count
