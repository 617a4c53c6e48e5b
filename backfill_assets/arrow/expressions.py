"""An MV definition evaluated with Arrow kernels, with exactly Spark's results, or not at all.

Why: hot paths (small barriers on the driver, bulk steps in Python workers) should not pay a
Spark job or a JVM crossing per row for a filter like ``qty > 0 AND NOT flag``. Only what is
proven equal to Spark (4.x, ANSI mode as the platform's session runs it) is compiled:
- types follow Spark's analysis: integer literals are int, or bigint when beyond int; a
  decimal literal's precision and scale are its digits (``0.05`` is decimal(2,2)); integer
  arithmetic gives the wider operand type (tinyint + tinyint is a tinyint); integers meeting
  a decimal become decimal(3/5/10/20, 0), an integer *literal* only its own digits (Spark's
  pickMinimumPrecision); decimal ``+ -`` and ``*`` get Spark's precision and scale, and a
  result beyond 38 digits (where Spark would round) is not compiled;
- integer arithmetic uses Arrow's checked kernels: an overflow (an error in ANSI Spark, a
  wrap-around without ANSI) raises `NotExact` and never yields a value; decimal arithmetic
  within 38 digits is exact on both sides;
- comparisons only within one family: numbers (widened exactly), strings (bytes, Spark's
  default UTF8_BINARY collation), booleans, dates; AND / OR / NOT are Kleene's logic;
- ``upper`` / ``lower`` only for ASCII values: Java's case mapping (Spark's) differs from
  Arrow's beyond it (Spark: upper('straße') = 'STRASSE', Arrow: 'STRAẞE'), so a batch with a
  non-ASCII value raises `NotExact`.
Every expression is evaluated on every row of a batch, rejected or not, as Spark's `project`
does, so a value Spark would fail on is refused here too. Each computed column's type is
checked against Spark's own analysis (``mv_schema``): any disagreement means "not compiled".
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.expressions import (
    COMPARISONS,
    Binary,
    Call,
    Column,
    IsNull,
    Literal,
    Node,
    Unary,
    parse,
)
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.core.names import VNODE

MAX_PRECISION = 38
_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_INT_DIGITS = {pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 20}
_ARITHMETIC = {"+": "add_checked", "-": "subtract_checked", "*": "multiply_checked"}
_COMPARE = {"=": "equal", "<>": "not_equal", "<": "less", "<=": "less_equal",
            ">": "greater", ">=": "greater_equal"}


class NotExact(Exception):
    """A batch holds a value whose Arrow result is not proven to be Spark's (an overflow, a
    non-ASCII case mapping): evaluate that batch with Spark instead."""


class _Unsupported(Exception):
    """Not compiled (internal: `compile_projection` turns it into None)."""


@dataclass(frozen=True)
class _Op:
    """A typed, resolved expression: what `_evaluate` runs (plain data, so picklable)."""

    kind: str  # col lit cast neg not arith cmp and or isnull notnull upper lower
    type: pa.DataType
    args: tuple[_Op, ...] = ()
    value: object = None  # column name, literal value, or the operator


def _family(t: pa.DataType) -> str | None:
    if t in _INTS:
        return "int"
    if pa.types.is_decimal128(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date32(t):
        return "date"
    return None


class _Compiler:
    """Resolves columns against the upstream schema and gives each node Spark's type."""

    def __init__(self, upstream_schema: pa.Schema):
        self.fields = [f for f in upstream_schema if f.name != VNODE]

    def compile(self, node: Node) -> _Op:
        if isinstance(node, Column):
            return self._column(node.name)
        if isinstance(node, Literal):
            return _literal(node)
        if isinstance(node, IsNull):
            operand = self.compile(node.operand)
            return _Op("notnull" if node.negated else "isnull", pa.bool_(), (operand,))
        if isinstance(node, Unary):
            operand = self.compile(node.operand)
            want = ("bool",) if node.op == "not" else ("int", "decimal")
            _require(_family(operand.type) in want, node.op)
            return _Op("not" if node.op == "not" else "neg", operand.type, (operand,))
        if isinstance(node, Call):
            _require(node.name in ("upper", "lower") and len(node.args) == 1, node.name)
            operand = self.compile(node.args[0])
            _require(_family(operand.type) == "string", node.name)
            return _Op(node.name, operand.type, (operand,))
        if isinstance(node, Binary):
            return self._binary(node.op, self.compile(node.left), self.compile(node.right))
        raise _Unsupported(repr(node))

    def _column(self, name: str) -> _Op:
        """Spark's default resolution: case-insensitive, an ambiguous name is an error."""
        matches = [f for f in self.fields if f.name.lower() == name.lower()]
        _require(len(matches) == 1 and _family(matches[0].type) is not None, name)
        return _Op("col", matches[0].type, value=matches[0].name)

    def _binary(self, op: str, left: _Op, right: _Op) -> _Op:
        lf, rf = _family(left.type), _family(right.type)
        if op in ("and", "or"):
            _require(lf == rf == "bool", op)
            return _Op(op, pa.bool_(), (left, right))
        numeric = lf in ("int", "decimal") and rf in ("int", "decimal")
        if op in COMPARISONS:
            if numeric:
                common = _wider(left, right)
                left, right = _cast_op(left, common), _cast_op(right, common)
            else:
                _require(lf == rf and lf is not None, op)
                if lf == "string" and left.type != right.type:
                    left, right = _cast_op(left, pa.large_string()), \
                        _cast_op(right, pa.large_string())
            return _Op("cmp", pa.bool_(), (left, right), op)
        _require(numeric and op in _ARITHMETIC, op)
        if lf == rf == "int":
            t = _wider(left, right)
            return _Op("arith", t, (_cast_op(left, t), _cast_op(right, t)), op)
        left, right = _cast_op(left, _as_decimal(left)), _cast_op(right, _as_decimal(right))
        (p1, s1), (p2, s2) = (left.type.precision, left.type.scale), \
            (right.type.precision, right.type.scale)
        if op == "*":
            p, s = p1 + p2 + 1, s1 + s2
        else:
            s = max(s1, s2)
            p = max(p1 - s1, p2 - s2) + s + 1
        _require(p <= MAX_PRECISION, "decimal precision beyond 38 (Spark would round)")
        return _Op("arith", pa.decimal128(p, s), (left, right), op)


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise _Unsupported(what)


def _literal(node: Literal) -> _Op:
    if node.kind == "int":
        v = int(node.value)  # type: ignore[call-overload]
        if -(1 << 31) <= v < (1 << 31):
            return _Op("lit", pa.int32(), value=v)
        _require(-(1 << 63) <= v < (1 << 63), "integer literal beyond bigint")
        return _Op("lit", pa.int64(), value=v)
    if node.kind == "decimal":
        text = str(node.value).lstrip("-")
        whole, frac = text.split(".")
        digits = (whole + frac).lstrip("0") or "0"
        precision = max(len(digits), len(frac))  # Java's BigDecimal, as Spark types it
        _require(precision <= MAX_PRECISION, "decimal literal beyond 38 digits")
        return _Op("lit", pa.decimal128(precision, len(frac)), value=Decimal(str(node.value)))
    if node.kind == "string":
        return _Op("lit", pa.string(), value=str(node.value))
    _require(node.kind == "bool", node.kind)
    return _Op("lit", pa.bool_(), value=bool(node.value))


def _as_decimal(op: _Op) -> pa.DataType:
    """An operand as Spark's decimal: an integer literal by its own digits, an integer
    column by its type's range."""
    if pa.types.is_decimal128(op.type):
        return op.type
    if op.kind == "lit":
        return pa.decimal128(max(1, len(str(abs(int(op.value))))), 0)  # type: ignore[call-overload]
    return pa.decimal128(_INT_DIGITS[op.type], 0)


def _wider(left: _Op, right: _Op) -> pa.DataType:
    """The type both numeric operands are compared or added in, holding both exactly."""
    if left.type in _INTS and right.type in _INTS:
        return max(left.type, right.type, key=_INTS.index)
    a, b = _as_decimal(left), _as_decimal(right)
    s = max(a.scale, b.scale)
    p = max(a.precision - a.scale, b.precision - b.scale) + s
    _require(p <= MAX_PRECISION, "comparison beyond 38 digits")
    return pa.decimal128(p, s)


def _cast_op(op: _Op, t: pa.DataType) -> _Op:
    """``op`` widened to ``t``; a literal is retyped instead (Arrow casts an int32 to
    decimal(1,0) only after checking the int32 range, not the value, and refuses)."""
    if op.type == t:
        return op
    if op.kind == "lit":
        value = Decimal(op.value) if pa.types.is_decimal128(t) else op.value  # type: ignore[arg-type]
        return _Op("lit", t, value=value)
    return _Op("cast", t, (op,))


def _evaluate(op: _Op, table: pa.Table):
    """The op over ``table``: an array, or a scalar for a constant expression."""
    k = op.kind
    if k == "col":
        return table.column(op.value)
    if k == "lit":
        return pa.scalar(op.value, op.type)
    args = [_evaluate(a, table) for a in op.args]
    if k == "cast":
        return pc.cast(args[0], op.type)  # widening only: never lossy, checked anyway
    if k == "arith":
        return _cast(getattr(pc, _ARITHMETIC[op.value])(*args), op.type)
    if k == "neg":
        return pc.negate_checked(args[0])
    if k == "cmp":
        return getattr(pc, _COMPARE[op.value])(*args)
    if k in ("and", "or"):
        return pc.and_kleene(*args) if k == "and" else pc.or_kleene(*args)
    if k == "not":
        return pc.invert(args[0])
    if k in ("isnull", "notnull"):
        return pc.is_null(args[0]) if k == "isnull" else pc.is_valid(args[0])
    if pc.all(pc.string_is_ascii(args[0])).as_py() is False:
        raise NotExact(f"{k}() of a non-ASCII value: Java's case mapping (Spark's) differs "
                       "from Arrow's")
    return pc.utf8_upper(args[0]) if k == "upper" else pc.utf8_lower(args[0])


def _cast(values, t: pa.DataType):
    return values if values.type == t else pc.cast(values, t)


def _full(values, rows: int) -> pa.Array | pa.ChunkedArray:
    """A constant expression's scalar as a column of ``rows`` values."""
    return pa.repeat(values, rows) if isinstance(values, pa.Scalar) else values


def _run(op: _Op, table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Evaluate, an Arrow refusal (overflow: ArrowInvalid) becoming `NotExact`."""
    try:
        return _full(_evaluate(op, table), table.num_rows)
    except pa.ArrowInvalid as e:
        raise NotExact(f"Arrow refused a value (Spark would fail or wrap): {e}") from e


class ArrowProjection:
    """A compiled definition: plain data (typed trees, schemas), so it pickles to Spark's
    Python workers. Input tables hold the upstream's columns (+ `vnode`) in its types. Called,
    it is a bulk write's transform (`project`)."""

    keeps_every_row = False  # its filter may drop rows

    def __init__(self, columns: tuple[str, ...], mv_schema: pa.Schema, keep_op: _Op | None,
                 computed_ops: dict[str, _Op]):
        self.columns, self.mv_schema = columns, mv_schema
        self.keep_op, self.computed_ops = keep_op, computed_ops

    @property
    def inputs(self) -> frozenset[str]:
        """The upstream columns the projection reads: those it selects and those its filter
        and computed columns name (a reader may leave the others unread)."""
        names, ops = set(self.columns), [self.keep_op, *self.computed_ops.values()]
        while ops:
            op = ops.pop()
            if op is not None:
                if op.kind == "col":
                    names.add(op.value)
                ops.extend(op.args)
        return frozenset(names)

    def keep(self, table: pa.Table) -> pa.Array:
        """The filter per row (bool), a null counting as rejected as in SQL's WHERE; all
        True without a filter. Raises `NotExact`."""
        if self.keep_op is None:
            return pa.array([True] * table.num_rows, pa.bool_())
        kept = pc.fill_null(_run(self.keep_op, table), False)
        return kept.combine_chunks() if isinstance(kept, pa.ChunkedArray) else kept

    def computed(self, table: pa.Table) -> dict[str, pa.Array | pa.ChunkedArray]:
        """Each computed column over every row, in ``mv_schema``'s type. Raises `NotExact`."""
        return {name: _cast(_run(op, table), self.mv_schema.field(name).type)
                for name, op in self.computed_ops.items()}

    def project(self, table: pa.Table) -> pa.Table:
        """The MV rows of ``table``: kept rows only, in order, columns and types exactly
        ``mv_schema``'s (selected, computed, `vnode`). Raises `NotExact`."""
        computed, kept = self.computed(table), self.keep(table)
        data = [_cast(table.column(f.name), f.type) if f.name not in computed
                else computed[f.name] for f in self.mv_schema]
        return pa.Table.from_arrays(data, schema=self.mv_schema).filter(kept)

    def __call__(self, table: pa.Table) -> pa.Table:
        return self.project(table)


def compile_projection(definition: MVDefinition, upstream_schema: pa.Schema,
                       mv_schema: pa.Schema) -> ArrowProjection | None:
    """The definition as Arrow kernels with Spark's results, or None (then Spark evaluates
    it): an expression outside the subset, an unknown or ambiguous column, types mixed
    outside the rules, or a computed type other than Spark's own analysis (``mv_schema``,
    from `engine.projection.validate_expressions`)."""
    names = [*definition.columns, *(c.name for c in definition.computed), VNODE]
    if mv_schema.names != names or any(c not in upstream_schema.names
                                       for c in (*definition.columns, VNODE)):
        return None
    compiler = _Compiler(upstream_schema)
    try:
        keep_op = None
        if definition.filter:
            keep_op = _compiled(compiler, definition.filter)
            _require(keep_op.type == pa.bool_(), "filter is not a boolean")
        computed = {}
        for c in definition.computed:
            op, want = _compiled(compiler, c.expr), mv_schema.field(c.name).type
            _require(op.type == want or _family(op.type) == _family(want) == "string",
                     f"{c.name}: {op.type} where Spark has {want}")
            computed[c.name] = op
    except _Unsupported:
        return None
    return ArrowProjection(tuple(definition.columns), mv_schema, keep_op, computed)


def _compiled(compiler: _Compiler, text: str) -> _Op:
    node = parse(text)
    _require(node is not None, text)
    return compiler.compile(node)  # type: ignore[arg-type]
