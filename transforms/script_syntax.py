"""The syntax tree of scripted-rating expressions, shared by the parser and the compiler.

A node can only stand for an operation of the language (``transforms.script_parser`` builds them
from text; ``transforms.script_compiler`` turns them into one Polars expression), so a tree names
no table, file or function outside the language.  ``pos`` is the node's 1-based column in the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl


def first_line(err: Exception) -> str:
    """The first line of an error message (Polars adds the whole expression below it)."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class ExpressionError(ValueError):
    """The text is not in the language: ``reason`` says why, ``column`` where (1-based)."""

    def __init__(self, reason: str, column: int) -> None:
        self.reason = reason
        self.column = column
        super().__init__(f"{reason} at column {column}")


@dataclass(frozen=True)
class Node:
    """Base of every node: ``pos`` is where the node starts in the text, for error messages."""

    pos: int


@dataclass(frozen=True)
class Number(Node):
    """A numeric literal, kept as written so the compiler can keep decimals exact."""

    text: str  # as written: the compiler decides integer, exact decimal or float


@dataclass(frozen=True)
class Str(Node):
    """A string literal ('...'), quotes removed."""

    value: str


@dataclass(frozen=True)
class Const(Node):
    """The keywords TRUE, FALSE and NULL."""

    value: bool | None  # TRUE, FALSE, NULL


@dataclass(frozen=True)
class Column(Node):
    """A reference to a column of the usage frame, by name."""

    name: str


@dataclass(frozen=True)
class Unary(Node):
    """A prefix operator applied to one operand."""

    op: str  # "-", "+", "not"
    operand: Node


@dataclass(frozen=True)
class Binary(Node):
    """An arithmetic, comparison or boolean operator between two operands."""

    op: str  # "+", "-", "*", "/", "%", "=", "<>", "<", "<=", ">", ">=", "and", "or"
    left: Node
    right: Node


@dataclass(frozen=True)
class Between(Node):
    """``operand [NOT] BETWEEN low AND high`` (both bounds inclusive, as in SQL)."""

    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True)
class InList(Node):
    """``operand [NOT] IN (items...)``."""

    operand: Node
    items: tuple[Node, ...]
    negated: bool


@dataclass(frozen=True)
class Like(Node):
    """``operand [NOT] LIKE|ILIKE pattern`` with SQL ``%`` and ``_`` wildcards."""

    operand: Node
    pattern: Node
    negated: bool
    case_insensitive: bool


@dataclass(frozen=True)
class IsNull(Node):
    """``operand IS [NOT] NULL``."""

    operand: Node
    negated: bool


@dataclass(frozen=True)
class Case(Node):
    """``CASE [operand] WHEN ... THEN ... [ELSE default] END``; with an operand, WHEN values compare to it."""

    operand: Node | None
    branches: tuple[tuple[Node, Node], ...]
    default: Node | None


@dataclass(frozen=True)
class Cast(Node):
    """``CAST(operand AS type)`` or ``operand::type``, the type already resolved to a Polars dtype."""

    operand: Node
    dtype: pl.DataType


@dataclass(frozen=True)
class Call(Node):
    """A call of one of the language's functions (``transforms.script_functions``)."""

    name: str  # lower case; EXTRACT(part FROM x) is date_part('part', x)
    args: tuple[Node, ...]


def walk(tree: Node) -> Iterator[tuple[Node, int]]:
    """Every node of ``tree`` with its depth (1 for the root), without recursion."""
    stack: list[tuple[object, int]] = [(tree, 1)]
    while stack:
        item, height = stack.pop()
        if isinstance(item, Node):
            yield item, height
            stack += [(child, height + 1) for child in vars(item).values()]
        elif isinstance(item, tuple):
            stack += [(child, height) for child in item]
