"""A small, exact subset of Spark SQL expressions, parsed without Spark.

Why: an MV's filter and computed columns are Spark SQL, and Spark evaluating a few thousand
rows of a small barrier costs a job (~0.06-0.1 s), while a bulk step pays two crossings
between the JVM and Python per row. The subset here is what can be evaluated elsewhere with
the same result (``arrow_expr``): columns, integer and decimal literals, plain strings,
booleans, ``+ - *``, comparisons, ``AND OR NOT``, ``IS [NOT] NULL``, ``upper``/``lower``.
``parse`` returns None for anything else, never an error: Spark stays the judge of what a
definition means, and the only evaluator of what this module does not know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    quoted: bool  # backticked: matched exactly; plain: case-insensitive, as Spark's default


@dataclass(frozen=True)
class Literal:
    value: object  # int, decimal text ("12.50"), str, bool
    kind: str  # "int" | "decimal" | "string" | "bool"


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "not"
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str  # + - * = <> < <= > >= and or
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    name: str  # upper | lower
    args: tuple[Node, ...]


@dataclass(frozen=True)
class IsNull:
    operand: Node
    negated: bool


Node = Column | Literal | Unary | Binary | Call | IsNull

FUNCTIONS = frozenset({"upper", "lower"})
_TOKEN = re.compile(r"""\s*(?:
    (?P<number>\d+(?:\.\d+)?(?![\w.]))
  | (?P<string>'[^'\\]*')
  | (?P<quoted>`(?:[^`]|``)+`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><>|!=|<=|>=|==|[-+*=<>(),])
)""", re.VERBOSE)
_COMPARE = {"=": "=", "==": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">",
            ">=": ">="}
_KEYWORDS = frozenset({"and", "or", "not", "is", "null", "true", "false"})


class _Unsupported(Exception):
    """Outside the subset (internal: ``parse`` turns it into None)."""


def parse(text: str) -> Node | None:
    """The expression's tree, or None when ``text`` is outside the subset."""
    try:
        tokens = _tokenize(text)
        parser = _Parser(tokens)
        node = parser.disjunction()
        if parser.peek() is not None:
            return None
        return node
    except _Unsupported:
        return None


def columns_of(node: Node) -> list[Column]:
    """Every column the expression reads."""
    if isinstance(node, Column):
        return [node]
    if isinstance(node, (Unary, IsNull)):
        return columns_of(node.operand)
    if isinstance(node, Binary):
        return columns_of(node.left) + columns_of(node.right)
    if isinstance(node, Call):
        return [c for a in node.args for c in columns_of(a)]
    return []


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unsupported(text[pos:])
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent with Spark's precedence: OR < AND < NOT < comparison / IS NULL <
    + - < * < unary minus."""

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
        if self._op("-") is not None:
            return Unary("-", self.unary())
        return self.atom()

    def atom(self) -> Node:
        t = self.peek()
        if t is None:
            raise _Unsupported("end of text")
        kind, text = t
        self.i += 1
        if kind == "number":
            return Literal(int(text), "int") if "." not in text else Literal(text, "decimal")
        if kind == "string":
            return Literal(text[1:-1], "string")
        if kind == "quoted":
            return Column(text[1:-1].replace("``", "`"), True)
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
                raise _Unsupported("one argument")
            return Call(low, (arg,))
        if low in _KEYWORDS:
            raise _Unsupported(text)
        return Column(text, False)
