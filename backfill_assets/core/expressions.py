"""A small subset of Spark SQL expressions, parsed without Spark.

Why: an MV's filter and computed columns are Spark SQL texts, and having Spark evaluate a few
thousand rows costs a job, while a bulk step pays a JVM <-> Python crossing per row. The
subset parsed here is the one `arrow.expressions` can evaluate with exactly Spark's results:
columns, integer and decimal literals, plain string literals, TRUE / FALSE, ``+ - *``,
unary minus, comparisons, ``AND OR NOT``, ``IS [NOT] NULL``, ``upper`` / ``lower``.

``parse`` returns None for any other text and never raises: Spark stays the validator of
what a definition means and the evaluator of everything this module does not know. The
grammar follows Spark's parser where they could differ:
- precedence OR < AND < NOT < comparison / IS NULL < ``+ -`` < ``*`` < unary minus; a
  comparison does not chain (``a = b = c`` is refused);
- ``-`` directly before a number is part of the literal, as in Spark's grammar
  (``MINUS? INTEGER_VALUE``): ``-2147483648`` is an int and ``amount * -3`` multiplies by a
  one-digit decimal, while ``-(3)`` is a negation;
- ``--`` starts a comment and ``${...}`` is variable substitution in Spark's parser, even
  inside string literals: texts holding either are refused; so are backslashes in strings
  (Spark's escapes are not Python's) and non-ASCII whitespace;
- names that Spark reads as functions without parentheses (``current_date``, ``user``...)
  are refused unless backticked, since a column of that name would not be what Spark reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A column reference (backticks removed; resolution is the adapter's, case-insensitive)."""

    name: str


@dataclass(frozen=True)
class Literal:
    """A constant: kind "int" (value an int), "decimal" (value the literal's text, e.g.
    "-1.50": its digits give Spark's precision and scale), "string" or "bool"."""

    value: object
    kind: str


@dataclass(frozen=True)
class Unary:
    """``-`` (negation) or ``not``."""

    op: str
    operand: Node


@dataclass(frozen=True)
class Binary:
    """``+ - *``, a comparison (``= <> < <= > >=``, ``==`` and ``!=`` normalized) or
    ``and`` / ``or``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    """A function call; ``name`` lowercased (``upper`` or ``lower``)."""

    name: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class IsNull:
    """``operand IS NULL`` (or ``IS NOT NULL`` when negated)."""

    operand: Node
    negated: bool


Node = Column | Literal | Unary | Binary | Call | IsNull

FUNCTIONS = frozenset({"upper", "lower"})
COMPARISONS = frozenset({"=", "<>", "<", "<=", ">", ">="})
_COMPARE = {"=": "=", "==": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">",
            ">=": ">="}
_KEYWORDS = frozenset({"and", "or", "not", "is", "null", "true", "false"})
# read by Spark as functions without parentheses (its `currentLike` rule), never as a column
_NILADIC = frozenset({"current_date", "current_timestamp", "current_time", "current_user",
                      "user", "session_user", "current_schema", "current_database",
                      "current_catalog", "current_role"})
_TOKEN = re.compile(r"""[ \t\r\n]*(?:
    (?P<number>[0-9]+(?:\.[0-9]+)?(?![A-Za-z0-9_.]))
  | (?P<string>'[^'\\]*')
  | (?P<quoted>`(?:[^`]|``)+`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><>|!=|<=|>=|==|[-+*=<>(),])
)""", re.VERBOSE)


class _Unsupported(Exception):
    """Outside the subset (internal: ``parse`` turns it into None)."""


def parse(text: str) -> Node | None:
    """The expression's tree, or None when ``text`` is outside the subset (never raises)."""
    if not isinstance(text, str) or "${" in text or "--" in text:
        return None
    try:
        parser = _Parser(_tokenize(text))
        node = parser.disjunction()
        return node if parser.peek() is None else None
    except (_Unsupported, RecursionError, ValueError):
        return None


def columns_of(node: Node) -> list[str]:
    """The names of every column the expression reads, in order of appearance."""
    if isinstance(node, Column):
        return [node.name]
    if isinstance(node, Unary | IsNull):
        return columns_of(node.operand)
    if isinstance(node, Binary):
        return columns_of(node.left) + columns_of(node.right)
    if isinstance(node, Call):
        return [c for a in node.args for c in columns_of(a)]
    return []


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos, end = [], 0, len(text.rstrip(" \t\r\n"))
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos or m.lastgroup is None:
            raise _Unsupported(text[pos:])
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens, one method per precedence level."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.i = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _word(self, *words: str) -> bool:
        t = self.peek()
        if t is not None and t[0] == "word" and t[1].lower() in words:
            self.i += 1
            return True
        return False

    def _op(self, *ops: str) -> str | None:
        t = self.peek()
        if t is not None and t[0] == "op" and t[1] in ops:
            self.i += 1
            return t[1]
        return None

    def disjunction(self) -> Node:
        node = self.conjunction()
        while self._word("or"):
            node = Binary("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self._word("and"):
            node = Binary("and", node, self.negation())
        return node

    def negation(self) -> Node:
        if self._word("not"):
            return Unary("not", self.negation())
        return self.comparison()

    def comparison(self) -> Node:
        node = self.additive()
        op = self._op(*_COMPARE)
        if op is not None:
            node = Binary(_COMPARE[op], node, self.additive())
        if self._word("is"):
            negated = self._word("not")
            if not self._word("null"):
                raise _Unsupported("IS without NULL")
            node = IsNull(node, negated)
        t = self.peek()
        if t is not None and (t[0] == "op" and t[1] in _COMPARE or
                              t[0] == "word" and t[1].lower() == "is"):
            raise _Unsupported("chained comparison")
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while (op := self._op("+", "-")) is not None:
            node = Binary(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self._op("*") is not None:
            node = Binary("*", node, self.unary())
        return node

    def unary(self) -> Node:
        if self._op("-") is None:
            return self.atom()
        t = self.peek()
        if t is not None and t[0] == "number":  # Spark's grammar: the sign is the literal's
            self.i += 1
            return _number("-" + t[1])
        return Unary("-", self.unary())

    def atom(self) -> Node:
        t = self.peek()
        if t is None:
            raise _Unsupported("end of text")
        kind, text = t
        self.i += 1
        if kind == "number":
            return _number(text)
        if kind == "string":
            return Literal(text[1:-1], "string")
        if kind == "quoted":
            return Column(text[1:-1].replace("``", "`"))
        if kind == "op" and text == "(":
            node = self.disjunction()
            if self._op(")") is None:
                raise _Unsupported("unclosed parenthesis")
            return node
        if kind != "word":
            raise _Unsupported(text)
        low = text.lower()
        if low in ("true", "false"):
            return Literal(low == "true", "bool")
        if self._op("(") is not None:
            if low not in FUNCTIONS:
                raise _Unsupported(f"function {text}")
            arg = self.disjunction()
            if self._op(")") is None:
                raise _Unsupported("one argument only")
            return Call(low, (arg,))
        if low in _KEYWORDS or low in _NILADIC:
            raise _Unsupported(text)
        return Column(text)


def _number(text: str) -> Literal:
    """An integer literal's value, or a decimal literal's text (sign included)."""
    return Literal(text, "decimal") if "." in text else Literal(int(text), "int")
