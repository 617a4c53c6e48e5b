"""An aggregate MV's `group_by` and `aggregates`: parsed, checked, and typed as Spark types them.

Why here, pure: every mistake a user can make in an aggregate definition (an unnamed
expression, an unsupported or non-deterministic function, a sum over strings, a name used
twice) is refused by name before anything is written, and the result types must be Spark's
(``SELECT group_by, aggregates ... GROUP BY group_by`` is what the MV equals). The types
follow Spark 4.2's analysis (`Sum`, `Average`, `Count`, `Min`, `Max` in catalyst):
- ``count(*)``, ``count(e)``, ``count(DISTINCT e)`` -> bigint;
- ``sum``: tinyint..bigint -> bigint, float/double -> double,
  decimal(p,s) -> decimal(min(38,p+10), s);
- ``avg``: decimal(p,s) -> decimal(min(38,p+4), min(38,s+4)), other numbers -> double;
- ``min`` / ``max``: the input's type.
An argument whose type is not known yet (an expression: Spark's analysis types it) is checked
by `check_input_types` once the adapter has that type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.core.errors import InvalidAggregate
from backfill_assets.core.key_types import parse_key_type
from backfill_assets.core.sql_calls import row_expression_problems

FUNCTIONS = ("count", "sum", "avg", "min", "max")
# the MV's key column: the group key as text (a key lookup never matches a null group value),
# so no output may take its name
GROUP_KEY = "group_key"
SUPPORTED = "count(*), count(expr), count(DISTINCT expr), sum(expr), avg(expr), min(expr), " \
            "max(expr)"
INTEGERS = ("tinyint", "smallint", "int", "bigint")
FLOATS = ("float", "double")
ORDERED = (*INTEGERS, *FLOATS, "string", "binary", "date", "timestamp", "timestamp_ntz",
           "boolean")
_ALIASES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint",
            "real": "float", "bool": "boolean"}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_IDENT = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)+`)$")
_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)
_DISTINCT = re.compile(r"^\s*distinct\s+(.+)$", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class GroupColumn:
    """One group-key column of the MV: its output name and the Spark SQL expression (a plain
    column's expression is its own name)."""

    name: str
    expr: str


@dataclass(frozen=True)
class Aggregate:
    """One aggregate output column: ``function`` in FUNCTIONS, ``arg`` its Spark SQL argument
    (None for ``count(*)``), ``distinct`` for ``count(DISTINCT arg)``."""

    name: str
    function: str
    arg: str | None
    distinct: bool = False

    @property
    def text(self) -> str:
        """The canonical text, as recorded in the MV's fingerprint."""
        inner = "*" if self.arg is None else ("DISTINCT " if self.distinct else "") + self.arg
        return f"{self.function}({inner})"

    @property
    def keeps_input(self) -> bool:
        """Whether the group's input values are kept (min/max retract to the next extreme,
        count(DISTINCT) needs the multiset); float sums too, see `needs_input`."""
        return self.function in ("min", "max") or self.distinct


def needs_input(agg: Aggregate, input_type: str) -> bool:
    """Whether the aggregate is recomputed per touched group from its kept input, rather than
    kept as exact running state: min/max, count(DISTINCT), and sum/avg of floats (a running
    float sum would drift with every retraction; one over the current values does not)."""
    return agg.keeps_input or (agg.function in ("sum", "avg") and canonical_type(input_type)
                               in FLOATS)


def canonical_type(name: str) -> str:
    """A Spark / platform type name in the platform's spelling ("decimal(10,2)", "bigint")."""
    text = re.sub(r"\s+", "", str(name)).lower()
    return _ALIASES.get(text, text)


def decimal_of(type_name: str) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type name, or None."""
    m = _DECIMAL.match(canonical_type(type_name))
    return (int(m[1]), int(m[2])) if m else None


def parse_group_by(value: object) -> tuple[GroupColumn, ...]:
    """``group_by`` from plain data: a list of column names or {name, expr} mappings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise InvalidAggregate(
            f"group_by must be a non-empty list of column names or {{name, expr}} mappings, "
            f"got {value!r}")
    return tuple(_group_column(i) for i in items)


def _group_column(item: object) -> GroupColumn:
    if isinstance(item, GroupColumn):
        return item
    if isinstance(item, str) and _IDENT.match(item.strip()):
        name = item.strip()
        return GroupColumn(_unquote(name), name)
    if isinstance(item, Mapping) and set(item) == {"name", "expr"} \
            and all(isinstance(item[k], str) and item[k].strip() for k in ("name", "expr")):
        return GroupColumn(str(item["name"]), str(item["expr"]))
    raise InvalidAggregate(
        f"group_by item {item!r} must be a column name (in backquotes unless it is a plain "
        "identifier: '`ré gion`') or a mapping with exactly the keys name and expr (an "
        "expression needs a name: {name: day, expr: 'to_date(ts)'})")


def parse_aggregates(value: object) -> tuple[Aggregate, ...]:
    """``aggregates`` from plain data: a mapping output name -> call text, or a list of
    {name, expr} mappings (or built `Aggregate`s)."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list | tuple) and all(
            isinstance(i, Aggregate) or (isinstance(i, Mapping) and set(i) == {"name", "expr"})
            for i in value):
        pairs = [(i.name, i) if isinstance(i, Aggregate) else (i["name"], i["expr"])
                 for i in value]
    else:
        raise InvalidAggregate(
            f"aggregates must map output names to calls ({SUPPORTED}), got {value!r}")
    if not pairs:
        raise InvalidAggregate(f"aggregates is empty: name at least one of {SUPPORTED}")
    return tuple(v if isinstance(v, Aggregate) else parse_call(str(k), v) for k, v in pairs)


def parse_call(name: str, text: object) -> Aggregate:
    """One aggregate call's text as an `Aggregate`; refuses other functions by name."""
    m = _CALL.match(text) if isinstance(text, str) else None
    if m is None or not _balanced(m[2]):
        raise InvalidAggregate(
            f"aggregate {name!r} is {text!r}: write one call of {SUPPORTED}")
    function, inner = m[1].lower(), m[2].strip()
    if function not in FUNCTIONS:
        raise InvalidAggregate(
            f"aggregate {name!r} calls {function}(), which is not supported: use one of "
            f"{SUPPORTED} (only these can be kept exact under updates and deletes)")
    if inner == "*":
        if function != "count":
            raise InvalidAggregate(f"aggregate {name!r}: only count takes *, not {function}")
        return Aggregate(name, "count", None)
    distinct = _DISTINCT.match(inner)
    if distinct and function != "count":
        raise InvalidAggregate(
            f"aggregate {name!r}: DISTINCT is supported in count only (for {function}, "
            "DISTINCT does not change min/max; sum/avg of distinct values cannot be kept)")
    arg = distinct[1].strip() if distinct else inner
    if not arg or _top_level_comma(arg):
        raise InvalidAggregate(f"aggregate {name!r} ({text!r}) must have exactly one argument")
    return Aggregate(name, function, arg, bool(distinct))


def _outside_quotes(text: str) -> list[tuple[str, int]]:
    """Each character outside string literals and backticks with the parenthesis depth
    before it (so ``sum(a) + max(b)`` is not read as one call, nor ``f(a, b)`` as one
    argument)."""
    out, depth, quote = [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        else:
            out.append((ch, depth))
            depth += {"(": 1, ")": -1}.get(ch, 0)
    return out


def _balanced(text: str) -> bool:
    walk = _outside_quotes(text)
    ends = [d + {"(": 1, ")": -1}.get(ch, 0) for ch, d in walk]
    return min(ends, default=0) >= 0 and (not ends or ends[-1] == 0)


def _top_level_comma(text: str) -> bool:
    return any(ch == "," and depth == 0 for ch, depth in _outside_quotes(text))


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def plain_column(expr: str) -> str | None:
    """The column an expression names when it is just a column, else None."""
    text = expr.strip()
    return _unquote(text) if _IDENT.match(text) else None


def kept_input_key_problems(pk: list[str], aggregates: tuple[Aggregate, ...],
                            available: Mapping[str, str]) -> list[str]:
    """An upstream keyed by a column named like the kept input's own key column (an
    aggregate MV's `group_key`: an aggregate over an aggregate MV) cannot keep input: the
    kept input holds both columns. Any sum/avg not over a known exact column may need it."""
    if GROUP_KEY not in [n.lower() for n in pk]:
        return []
    lower = {n.lower(): t for n, t in available.items()}
    kept = [a.name for a in aggregates if a.keeps_input or (
        a.function in ("sum", "avg") and canonical_type(
            lower.get((plain_column(a.arg or "") or "").lower(), "") or "double") in FLOATS)]
    return [f"aggregates {kept} keep their input per group, keyed by the upstream's primary "
            f"key, whose column {GROUP_KEY!r} is named like the kept input's own group key: "
            "key this MV by the upstream's group columns instead (primary_key: [region, ...], "
            "never null), or aggregate with count, and sum/avg of exact columns"] if kept else []


def definition_problems(group_by: tuple[GroupColumn, ...], aggregates: tuple[Aggregate, ...],
                        available: Mapping[str, str]) -> list[str]:
    """Why this group_by / aggregates pair cannot be maintained (empty: it can, as far as the
    core sees). ``available``: the names an expression may read (upstream columns and computed
    columns) -> type name ("" when not known yet)."""
    out = [f"output {n!r} is named like the MV's own key column {GROUP_KEY!r} (the group key "
           "as text): give it another name"
           for n in [*(g.name for g in group_by), *(a.name for a in aggregates)]
           if n.lower() == GROUP_KEY]
    lower = {n.lower(): t for n, t in available.items()}
    for g in group_by:
        out += row_expression_problems(g.expr, f"group_by {g.name!r}")
        col = plain_column(g.expr)
        if col is not None and col.lower() not in lower:
            out.append(f"group_by {g.name!r} names unknown column {col!r}: pick from "
                       f"({', '.join(available)}) or write an expression")
    for a in aggregates:
        if a.arg is not None:
            out += row_expression_problems(a.arg, f"aggregate {a.name!r}")
            col = plain_column(a.arg)
            if col is not None and col.lower() not in lower:
                out.append(f"aggregate {a.name!r} reads unknown column {col!r}: pick from "
                           f"({', '.join(available)})")
    if out:
        return out
    types = {g.name: lower.get((plain_column(g.expr) or "").lower(), "") for g in group_by}
    types |= {a.name: lower.get((plain_column(a.arg) or "").lower(), "") for a in aggregates
              if a.arg is not None}
    return type_problems(group_by, aggregates, {k: v for k, v in types.items() if v})


def type_problems(group_by: tuple[GroupColumn, ...], aggregates: tuple[Aggregate, ...],
                  types: Mapping[str, str]) -> list[str]:
    """Why a group column or an aggregate's argument has a type that cannot be kept exact.
    ``types``: group column name or aggregate name -> the type of its expression / argument;
    names missing from it are not judged."""
    out = []
    for g in group_by:
        if g.name in types:
            try:
                parse_key_type(canonical_type(types[g.name]), g.name)
            except Exception:  # noqa: BLE001 - the key type module says why; reworded here
                out.append(
                    f"group_by {g.name!r} has type {types[g.name]}, which cannot key the MV "
                    "(int, bigint, string, date, timestamp or decimal(p,s)): cast it, e.g. "
                    f"{{name: {g.name}, expr: 'CAST({g.expr} AS bigint)'}}")
    for a in aggregates:
        if a.name in types:
            problem = _input_problem(a, canonical_type(types[a.name]))
            if problem:
                out.append(f"aggregate {a.name!r} ({a.text}) over {types[a.name]}: {problem}")
    return out


def _input_problem(a: Aggregate, t: str) -> str | None:
    numeric = t in INTEGERS or t in FLOATS or decimal_of(t) is not None
    if a.function in ("sum", "avg") and not numeric:
        return ("sum and avg are kept exact over numbers only (tinyint..bigint, float, "
                "double, decimal(p,s)): cast the argument to a number")
    if a.function in ("min", "max") and t not in ORDERED and decimal_of(t) is None:
        return ("min and max need a type with an order (numbers, string, binary, date, "
                "timestamp, boolean)")
    if a.distinct and (t in FLOATS or (t not in ORDERED and decimal_of(t) is None)):
        return ("count(DISTINCT) is kept exact over integers, decimals, strings, binary, "
                "dates, timestamps and booleans (Spark normalizes -0.0 and NaN in floats): "
                "cast the argument to decimal(p,s)")
    if t == "null" or t == "void":
        return "the argument is always null: aggregate a typed expression"
    return None


def result_type(a: Aggregate, input_type: str) -> str:
    """The Spark type of the aggregate's output column (see the module docstring)."""
    t = canonical_type(input_type)
    if a.function == "count":
        return "bigint"
    dec = decimal_of(t)
    if a.function == "sum":
        if dec:
            return f"decimal({min(38, dec[0] + 10)},{dec[1]})"
        return "bigint" if t in INTEGERS else "double"
    if a.function == "avg":
        if dec:
            return f"decimal({min(38, dec[0] + 4)},{min(38, dec[1] + 4)})"
        return "double"
    return f"decimal({dec[0]},{dec[1]})" if dec else t


def check_input_types(group_by: tuple[GroupColumn, ...], aggregates: tuple[Aggregate, ...],
                      types: Mapping[str, str]) -> dict[str, str]:
    """Every output column's type (group columns keep theirs), or InvalidAggregate naming each
    problem. ``types``: as in `type_problems`, complete (from Spark's analysis)."""
    problems = type_problems(group_by, aggregates, types)
    missing = [n for n in [*(g.name for g in group_by), *(a.name for a in aggregates
                                                            if a.arg is not None)]
               if n not in types]
    if missing:
        problems.append(f"no type for {missing}: analyse the expressions first")
    if problems:
        raise InvalidAggregate("aggregate MV cannot be kept exact: " + "; ".join(problems))
    out = {g.name: canonical_type(types[g.name]) for g in group_by}
    return out | {a.name: result_type(a, types.get(a.name, "")) for a in aggregates}
