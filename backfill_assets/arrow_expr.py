"""An MV definition evaluated in Arrow with Spark's results, or not at all.

`core.expressions` parses a subset of Spark SQL; this module gives each node Spark's result
type (integer widening, decimal precision and scale, literal types) and evaluates it with
Arrow kernels whose values are Spark's for every input they accept:
- integer arithmetic uses the checked kernels: an overflow (an error under Spark's ANSI mode,
  a wrap-around without it) raises `NotExact` instead of guessing;
- decimal arithmetic is exact as long as the result precision fits 38 digits (Spark's own
  rule then involves no rounding); beyond, the expression is not compiled;
- AND / OR / NOT are three-valued like Spark's (Kleene); comparisons only within one family
  (integers and decimals, strings by bytes, booleans, dates); a filter's null rejects;
- `upper` / `lower` only for ASCII text: Java's case mapping, which Spark uses, differs from
  Arrow's beyond it (Spark: upper('straße') = 'STRASSE', Arrow: 'STRAẞE'), so any non-ASCII
  value raises `NotExact`.
Every computed column's type is checked against Spark's own analysis of the definition
(`mv_schema`), and computed columns are evaluated on every row, kept or not, so a value Spark
would fail on is never silently produced here. Anything outside: `compile_projection` returns
None and Spark evaluates the definition.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.expressions import Binary, Call, Column, IsNull, Literal, Node, Unary
from backfill_assets.core.expressions import parse as parse_expression
from backfill_assets.core.mv_definition import MVDefinition

VNODE = "vnode"
_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_INT_DIGITS = {pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 20}
_ARITHMETIC = {"+": "add_checked", "-": "subtract_checked", "*": "multiply_checked"}
_COMPARE = {"=": "equal", "<>": "not_equal", "<": "less", "<=": "less_equal",
            ">": "greater", ">=": "greater_equal"}


class NotExact(Exception):
    """Rows hold a value whose Arrow result is not proven to be Spark's: evaluate in Spark."""


class _Unsupported(Exception):
    """Not compiled (internal)."""


def _family(t: pa.DataType) -> str | None:
    if t in _INTS:
        return "int"
    if pa.types.is_decimal128(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date32(t):
        return "date"
    return None


def _as_decimal(t: pa.DataType, literal: Node | None = None) -> pa.DataType:
    """An integer as Spark's decimal for decimal arithmetic (an integer literal: its own
    digits, spark.sql.legacy.literal.pickMinimumPrecision)."""
    if pa.types.is_decimal128(t):
        return t
    if isinstance(literal, Literal):
        return pa.decimal128(max(1, len(str(abs(int(literal.value))))), 0)
    return pa.decimal128(_INT_DIGITS[t], 0)


class _Typed:
    """Each node's Spark result type over an upstream schema."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema

    def column(self, node: Column) -> str:
        matches = [f.name for f in self.schema if f.name.lower() == node.name.lower()]
        if len(matches) != 1:
            raise _Unsupported(f"column {node.name}")
        return matches[0]

    def type_of(self, node: Node) -> pa.DataType:
        if isinstance(node, Column):
            t = self.schema.field(self.column(node)).type
            return pa.string() if _family(t) == "string" else t
        if isinstance(node, Literal):
            return self._literal(node)
        if isinstance(node, IsNull):
            if not isinstance(node.operand, Column):
                self.type_of(node.operand)
            return pa.bool_()
        if isinstance(node, Unary):
            t = self.type_of(node.operand)
            want = "bool" if node.op == "not" else ("int", "decimal")
            if _family(t) not in want:
                raise _Unsupported(node.op)
            return t
        if isinstance(node, Call):
            if _family(self.type_of(node.args[0])) != "string":
                raise _Unsupported(node.name)
            return pa.string()
        return self._binary(node)

    def _literal(self, node: Literal) -> pa.DataType:
        if node.kind == "int":
            v = int(node.value)
            if -(1 << 31) <= v < (1 << 31):
                return pa.int32()
            if -(1 << 63) <= v < (1 << 63):
                return pa.int64()
            raise _Unsupported("integer literal")
        if node.kind == "decimal":
            whole, frac = str(node.value).split(".")
            digits = (whole + frac).lstrip("0") or "0"
            precision = max(len(digits), len(frac))
            if precision > 38:
                raise _Unsupported("decimal literal")
            return pa.decimal128(precision, len(frac))
        return pa.string() if node.kind == "string" else pa.bool_()

    def _binary(self, node: Binary) -> pa.DataType:
        lt, rt = self.type_of(node.left), self.type_of(node.right)
        lf, rf = _family(lt), _family(rt)
        if node.op in ("and", "or"):
            if lf != "bool" or rf != "bool":
                raise _Unsupported(node.op)
            return pa.bool_()
        numeric = lf in ("int", "decimal") and rf in ("int", "decimal")
        if node.op in _COMPARE:
            if not numeric and (lf != rf or lf is None):
                raise _Unsupported(node.op)
            if numeric and "decimal" in (lf, rf):
                self.common_decimal(lt, rt)
            return pa.bool_()
        if not numeric:
            raise _Unsupported(node.op)
        if lf == rf == "int":
            return max(lt, rt, key=_INTS.index)
        (p1, s1), (p2, s2) = _ps(_as_decimal(lt, node.left)), _ps(_as_decimal(rt, node.right))
        if node.op == "*":
            p, s = p1 + p2 + 1, s1 + s2
        else:
            s = max(s1, s2)
            p = max(p1 - s1, p2 - s2) + s + 1
        if p > 38:
            raise _Unsupported("decimal precision beyond 38")
        return pa.decimal128(p, s)

    def common_decimal(self, lt: pa.DataType, rt: pa.DataType) -> pa.DataType:
        (p1, s1), (p2, s2) = _ps(_as_decimal(lt)), _ps(_as_decimal(rt))
        s = max(s1, s2)
        p = max(p1 - s1, p2 - s2) + s
        if p > 38:
            raise _Unsupported("comparison beyond 38 digits")
        return pa.decimal128(p, s)


def _ps(t: pa.DataType) -> tuple[int, int]:
    return t.precision, t.scale


class ArrowProjection:
    """A compiled definition (picklable: Spark's Python workers run it in bulk steps)."""

    def __init__(self, definition: MVDefinition, upstream_schema: pa.Schema,
                 mv_schema: pa.Schema, filter_node: Node | None,
                 computed: Mapping[str, Node]):
        self.columns = list(definition.columns)
        self.upstream_schema, self.mv_schema = upstream_schema, mv_schema
        self.filter_node, self.computed_nodes = filter_node, dict(computed)

    def keep(self, table: pa.Table) -> pa.Array:
        """The filter per row, a null counting as rejected (SQL's WHERE)."""
        if self.filter_node is None:
            return pa.array([True] * table.num_rows, pa.bool_())
        kept = _Evaluator(self.upstream_schema, table).eval(self.filter_node)
        return _column(pc.fill_null(kept, False), table.num_rows)

    def project(self, table: pa.Table) -> pa.Table:
        """The MV rows of upstream ``table`` (with ``vnode``): kept rows only, columns and
        types exactly ``mv_schema``'s. Raises NotExact."""
        ev, rows = _Evaluator(self.upstream_schema, table), table.num_rows
        try:
            computed = {name: _column(ev.eval(node), rows)
                        for name, node in self.computed_nodes.items()}
            kept = self.keep(table)
        except NotExact:
            raise
        except Exception as e:  # noqa: BLE001 - an overflow, or a kernel Arrow lacks: Spark
            raise NotExact(f"Arrow refused a value Spark must judge: {e}") from e
        data = {c: table.column(c) for c in self.columns}
        data.update(computed)
        data[VNODE] = table.column(VNODE)
        out = pa.table({f.name: _cast(data[f.name], f.type) for f in self.mv_schema},
                       schema=self.mv_schema)
        return out.filter(kept)


class _Evaluator:
    def __init__(self, schema: pa.Schema, table: pa.Table):
        self.typed, self.table = _Typed(schema), table

    def eval(self, node: Node):
        t = self.typed.type_of(node)
        if isinstance(node, Column):
            return _cast(self.table.column(self.typed.column(node)), t)
        if isinstance(node, Literal):
            value = node.value
            if node.kind == "decimal":
                from decimal import Decimal

                value = Decimal(str(value))
            return pa.scalar(value, t)
        if isinstance(node, IsNull):
            operand = self.eval(node.operand)
            return pc.is_valid(operand) if node.negated else pc.is_null(operand)
        if isinstance(node, Unary):
            operand = self.eval(node.operand)
            return pc.invert(operand) if node.op == "not" else pc.negate_checked(operand)
        if isinstance(node, Call):
            text = self.eval(node.args[0])
            if pc.all(pc.string_is_ascii(text)).as_py() is False:
                raise NotExact(f"{node.name}() of non-ASCII text: Java's case mapping "
                               "(Spark's) differs from Arrow's")
            return pc.utf8_upper(text) if node.name == "upper" else pc.utf8_lower(text)
        return self._binary(node, t)

    def _binary(self, node: Binary, t: pa.DataType):
        left, right = self.eval(node.left), self.eval(node.right)
        if node.op == "and":
            return pc.and_kleene(left, right)
        if node.op == "or":
            return pc.or_kleene(left, right)
        lt, rt = self.typed.type_of(node.left), self.typed.type_of(node.right)
        if node.op in _COMPARE:
            if "decimal" in (_family(lt), _family(rt)):
                common = self.typed.common_decimal(lt, rt)
                left, right = _cast(left, common), _cast(right, common)
            elif _family(lt) == "int":
                wide = max(lt, rt, key=_INTS.index)
                left, right = _cast(left, wide), _cast(right, wide)
            return getattr(pc, _COMPARE[node.op])(left, right)
        if pa.types.is_decimal128(t):
            left = _cast(left, _as_decimal(lt, node.left))
            right = _cast(right, _as_decimal(rt, node.right))
        else:
            left, right = _cast(left, t), _cast(right, t)
        return _cast(getattr(pc, _ARITHMETIC[node.op])(left, right), t)


def _column(values, rows: int):
    """An expression's result as a column (a constant expression gives a scalar)."""
    return pa.repeat(values, rows) if isinstance(values, pa.Scalar) else values


def _cast(values, t: pa.DataType):
    return values if values.type == t else values.cast(t)


def compile_projection(definition: MVDefinition, upstream_schema: pa.Schema,
                       mv_schema: pa.Schema) -> ArrowProjection | None:
    """The definition as Arrow kernels with Spark's results, or None (Spark evaluates it):
    an expression outside the subset, or a computed type other than Spark's analysis
    (``mv_schema``, from `mv_spark.validate_expressions`)."""
    typed = _Typed(upstream_schema)
    try:
        filter_node = None
        if definition.filter:
            filter_node = parse_expression(definition.filter)
            if filter_node is None or typed.type_of(filter_node) != pa.bool_():
                return None
        computed = {}
        for c in definition.computed:
            node = parse_expression(c.expr)
            if node is None:
                return None
            t, want = typed.type_of(node), mv_schema.field(c.name).type
            if t != want and not (_family(t) == _family(want) == "string"):
                return None
            computed[c.name] = node
    except (_Unsupported, KeyError):
        return None
    return ArrowProjection(definition, upstream_schema, mv_schema, filter_node, computed)
