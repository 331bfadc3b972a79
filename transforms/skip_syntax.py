"""The syntax tree of ``skip_datapoints_expression`` and how each node compiles to Polars.

Split from ``skip_expression`` (the grammar and the parser) so each module has one job: these frozen
nodes are what the parser builds, what ``MetricDef`` carries to workers (hashable, comparable,
picklable) and what turns into one vectorized Polars expression.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from decimal import Decimal
from functools import reduce

import polars as pl

from ratebeam.transforms.schema import PRICE, QTY, TYPE, UNIT, groupby_column, metadata_column


class SkipExpressionError(ValueError):
    """The expression is not in the language: ``reason`` says why and where (1-based column)."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"{reason} in skip_datapoints_expression {text!r}")


NUMERIC_FIELDS = {"qty": QTY, "price": PRICE}
STRING_FIELDS = {"unit": UNIT, "type": TYPE}
LABEL_SECTIONS = ("groupby", "metadata")


@dataclass(frozen=True)
class Field:
    """A column of the batch: ``qty``, ``price``, ``unit``, ``type`` or a ``groupby``/``metadata`` label."""

    kind: str
    key: str | None = None
    default: str | None = None

    @property
    def is_number(self) -> bool:
        """Whether the field compares as an exact decimal (``qty``, ``price``) rather than a string."""
        return self.kind in NUMERIC_FIELDS

    def describe(self) -> str:
        """How error messages name the field (``groupby.project_id``)."""
        return f"{self.kind}.{self.key}" if self.key is not None else self.kind

    def to_polars(self) -> pl.Expr:
        """The batch column, a missing label filled with its ``.get`` default when one was given."""
        if self.kind in NUMERIC_FIELDS:
            return pl.col(NUMERIC_FIELDS[self.kind])
        if self.kind in STRING_FIELDS:
            return pl.col(STRING_FIELDS[self.kind])
        assert self.key is not None
        column = groupby_column(self.key) if self.kind == "groupby" else metadata_column(self.key)
        expr = pl.col(column)
        return expr if self.default is None else expr.fill_null(pl.lit(self.default, dtype=pl.String))


@dataclass(frozen=True)
class Literal:
    """A number (exact ``Decimal``) or a string."""

    value: Decimal | str

    @property
    def is_number(self) -> bool:
        """Whether the literal is a number (else a string)."""
        return isinstance(self.value, Decimal)

    def describe(self) -> str:
        """How error messages name the literal."""
        return f"the number {self.value}" if self.is_number else f"the string {self.value!r}"

    def to_polars(self) -> pl.Expr:
        """A literal typed exactly: a decimal keeps its own scale, so comparisons stay exact."""
        if isinstance(self.value, Decimal):
            return pl.lit(self.value, dtype=pl.Decimal(38, scale_of(self.value)))
        return pl.lit(self.value, dtype=pl.String)


Value = Field | Literal


@dataclass(frozen=True)
class Compare:
    """One comparison ``left op right`` (a chain ``a < b < c`` is an ``and`` of these)."""

    op: str
    left: Value
    right: Value

    def to_polars(self) -> pl.Expr:
        """The comparison as a Polars boolean expression (null when a side is null)."""
        return COMPARE_OPS[self.op](self.left.to_polars(), self.right.to_polars())


@dataclass(frozen=True)
class In:
    """``value [not] in (literals...)``."""

    value: Value
    items: tuple[Literal, ...]
    negated: bool = False

    def to_polars(self) -> pl.Expr:
        """An ``or`` of equalities, negated for ``not in``."""
        column = self.value.to_polars()
        # OR of equalities keeps three-valued logic (a missing label stays null) and exact decimals.
        equalities = [column == item.to_polars() for item in self.items]
        found = reduce(operator.or_, equalities) if equalities else Const(False).to_polars()
        return ~found if self.negated else found


@dataclass(frozen=True)
class Not:
    """``not operand`` (null stays null)."""

    operand: Node

    def to_polars(self) -> pl.Expr:
        """The negated operand."""
        return ~self.operand.to_polars()


@dataclass(frozen=True)
class BoolOp:
    """``and`` or ``or`` over two or more operands, with three-valued (Kleene) logic."""

    op: str  # "and" | "or"
    operands: tuple[Node, ...]

    def to_polars(self) -> pl.Expr:
        """The operands combined with Polars' ``&``/``|``, which are Kleene like SQL's."""
        combine = operator.and_ if self.op == "and" else operator.or_
        return reduce(combine, (o.to_polars() for o in self.operands))


@dataclass(frozen=True)
class Const:
    """The literal ``True`` or ``False``."""

    value: bool

    def to_polars(self) -> pl.Expr:
        """The constant repeated for every row of the batch."""
        return pl.repeat(self.value, pl.len(), dtype=pl.Boolean)  # one value per row, even alone


Node = Compare | In | Not | BoolOp | Const

COMPARE_OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class SkipExpression:
    """A parsed, checked expression: ``text`` as written, ``tree`` its syntax tree."""

    text: str
    tree: Node

    def to_polars(self) -> pl.Expr:
        """Boolean expression over a usage/rated batch: ``True`` = drop the point; never null."""
        return self.tree.to_polars().fill_null(False).alias("skip")

    def labels(self) -> frozenset[tuple[str, str]]:
        """The ``(section, key)`` labels the expression reads, e.g. ``("groupby", "flavor")``."""
        found: set[tuple[str, str]] = set()
        stack: list[object] = [self.tree]
        while stack:
            node = stack.pop()
            if isinstance(node, Field) and node.key is not None:
                found.add((node.kind, node.key))
            elif isinstance(node, Compare):
                stack += [node.left, node.right]
            elif isinstance(node, In):
                stack.append(node.value)
            elif isinstance(node, Not):
                stack.append(node.operand)
            elif isinstance(node, BoolOp):
                stack += list(node.operands)
        return frozenset(found)


def scale_of(value: Decimal) -> int:
    """The number of decimals ``value`` is written with (0 for an integer), its exact Polars scale."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent)
