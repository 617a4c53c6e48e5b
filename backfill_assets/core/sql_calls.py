"""Which functions a Spark SQL text calls, found without Spark.

Why: an aggregate MV is maintained from the change feed, so every expression in its
definition must be a function of one upstream row: a non-deterministic call (``rand()``,
``uuid()``, ``current_timestamp``) would give a retraction a different value than the row
it retracts, and an aggregate or window call inside a row expression has no meaning per row.
Spark accepts all of these, so they are refused here, by name, before anything is written.
Everything else in the text (which scalar functions exist, how columns resolve) stays Spark's
to judge, as for a row MV's expressions.

The scan skips string literals ('...' and "..." with backslash escapes), backticked names and
comments, and reports each word directly followed by ``(`` (a call) and each bare word Spark
reads as a niladic function (``current_date``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Spark functions whose value is not a function of the row (docs: "non-deterministic")
# or of the upstream's version (the session's clock, user, catalog).
NON_DETERMINISTIC = frozenset({
    "rand", "randn", "random", "uniform", "randstr", "uuid", "shuffle",
    "monotonically_increasing_id", "spark_partition_id", "input_file_name",
    "input_file_block_start", "input_file_block_length", "current_timestamp", "now",
    "current_date", "curdate", "current_time", "localtimestamp", "current_timezone",
    "current_user", "user", "session_user", "current_database", "current_schema",
    "current_catalog", "reflect", "java_method", "try_reflect",
})
# read as a call without parentheses (Spark's `currentLike` rule)
NILADIC = frozenset({"current_date", "current_timestamp", "current_time", "current_user",
                     "user", "session_user", "current_schema", "current_database",
                     "current_catalog", "localtimestamp"})
# calls that are not row-wise: aggregates and window functions of Spark 4
AGGREGATE_OR_WINDOW = frozenset({
    "any", "any_value", "approx_count_distinct", "approx_percentile", "array_agg", "avg",
    "bit_and", "bit_or", "bit_xor", "bitmap_construct_agg", "bitmap_or_agg", "bool_and",
    "bool_or", "collect_list", "collect_set", "corr", "count", "count_if",
    "count_min_sketch", "covar_pop", "covar_samp", "every", "first", "first_value",
    "grouping", "grouping_id", "histogram_numeric", "hll_sketch_agg", "hll_union_agg",
    "kurtosis", "last", "last_value", "listagg", "max", "max_by", "mean", "median", "min",
    "min_by", "mode", "percentile", "percentile_approx", "percentile_cont",
    "percentile_disc", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2",
    "regr_slope", "regr_sxx", "regr_sxy", "regr_syy", "skewness", "some", "std", "stddev",
    "stddev_pop", "stddev_samp", "string_agg", "sum", "try_avg", "try_sum", "var_pop",
    "var_samp", "variance", "cume_dist", "dense_rank", "lag", "lead", "nth_value", "ntile",
    "percent_rank", "rank", "row_number",
})

_TOKEN = re.compile(r"""
    (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<other>\S)
  | (?P<space>\s+)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Call:
    """A function named in the text: lowercased name, and whether its parentheses are empty
    (``unix_timestamp()`` reads the clock, ``unix_timestamp(ts)`` does not)."""

    name: str
    no_arguments: bool


def calls(text: str) -> list[Call]:
    """Every call in ``text`` (nested ones too), in order; ``OVER`` counts as a call of
    ``over`` so a window specification is seen."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)
              if m.lastgroup not in ("space", "comment")]
    out = []
    for i, (kind, value) in enumerate(tokens):
        if kind != "word":
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        prev = tokens[i - 1] if i else None
        after_dot = prev is not None and prev == ("other", ".")
        if nxt == ("other", "(") and not after_dot:
            empty = i + 2 < len(tokens) and tokens[i + 2] == ("other", ")")
            out.append(Call(value.lower(), empty))
        elif value.lower() == "over" or (value.lower() in NILADIC and not after_dot):
            out.append(Call(value.lower(), True))
    return out


def row_expression_problems(text: str, where: str) -> list[str]:
    """Why ``text`` is not a deterministic row-wise expression (empty: it may be one; Spark
    still judges the rest). ``where`` names the expression in the messages."""
    found = calls(text)
    out = []
    nondet = sorted({c.name for c in found if c.name in NON_DETERMINISTIC
                     or (c.name == "unix_timestamp" and c.no_arguments)})
    if nondet:
        out.append(
            f"{where} ({text!r}) calls {nondet}, which give a different value on each "
            "evaluation or session: an aggregate MV must be a function of the upstream's "
            "rows (pass such values in as upstream columns instead)"
        )
    grouped = sorted({c.name for c in found if c.name in AGGREGATE_OR_WINDOW
                      or c.name == "over"})
    if grouped:
        out.append(
            f"{where} ({text!r}) uses {grouped}, aggregate or window functions, where a "
            "row-wise expression is needed: aggregates go in `aggregates`, one per output "
            "column, and are not nested"
        )
    return out
