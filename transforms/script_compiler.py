"""Compile a scripted-rating syntax tree into one Polars expression, with Polars SQL's meaning.

Scripts were written for Polars SQL expressions (``pl.sql_expr``, Polars 2.1); they keep their
results, decimal for decimal, although no SQL engine sees them any more.  The tree is built into
the same expression Polars SQL builds, and the operators that SQL resolves once the operand types
are known are resolved the same way here (``self.dtype`` asks Polars for an operand's type):

- A literal such as ``1.50`` is ``Decimal(3, 2)``; an integer that fits ``i64`` is a dynamic
  integer, an exponent form (``1.5e0``) a float.  Literal arithmetic with a decimal point
  (``1.5 * 2 + 0.25``) is folded exactly at load time.
- ``*`` of decimals keeps the sum of the scales (a scale above 38 is refused), where the Polars
  expression API would round to the larger one: ``exact_mul`` gets that from the API's own
  kernels, with the same overflow error.
- ``/`` with a decimal rounds half-even to ``max(s1, min(s1 + 6, 12))`` decimals (``s1`` the
  dividend's scale).  Dividing by a value with more decimals than that is refused: the API
  cannot round once to fewer decimals than its operands have (CAST an operand instead).
- ``%`` truncates (the sign of the dividend), for decimals and integers; of a float it is refused.
- A decimal literal meeting a float becomes a float, as in SQL.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Context, Decimal
from functools import reduce
from typing import Any

import polars as pl

from ratebeam.transforms import script_syntax as ast
from ratebeam.transforms.schema import GROUPBY_PREFIX, METADATA_PREFIX
from ratebeam.transforms.script_functions import NULL, Value, call, ternary
from ratebeam.transforms.script_syntax import ExpressionError, first_line

_MAX_DIGITS = 38
_WIDE = Context(prec=100)  # exact for any two 38-digit operands (Python's default context rounds at 28)
_I64_MAX = 2**63 - 1
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def compile_tree(tree: ast.Node, schema: dict[str, pl.DataType]) -> pl.Expr:
    """The Polars expression of ``tree`` over a batch of ``schema``; ``ExpressionError`` if refused."""
    return _Compiler(schema).compile(tree).expr


def decimal_literal(value: Decimal) -> Value:
    """An exact literal at its spelled scale, in the fewest digits (as SQL types ``1.50``)."""
    _, digits, exponent = value.as_tuple()
    scale = max(0, -int(exponent))
    precision = max(len(str(int("".join(map(str, digits))))), scale, 1)
    return Value(pl.lit(value, dtype=pl.Decimal(precision, scale)), "decimal", value, True, True)


def _exact_digits(text: str) -> int:
    """The digits SQL counts for an exact literal: its integer digits and its written decimals."""
    whole, _, fraction = text.partition(".")
    return len(whole.lstrip("0")) + len(fraction)


def _scale(value: Decimal) -> int:
    return max(0, -int(value.as_tuple().exponent))


def exact_mul(a: pl.Expr, sa: int, b: pl.Expr, sb: int) -> pl.Expr:
    """``a * b`` at scale ``sa + sb`` (both > 0), failing exactly where the product does not fit.

    The API multiplies at the larger operand scale, so one operand is first cast to the product's
    scale ``S``.  Per row the cast one is ``a`` if ``|a| < 10^(38-S)``, else ``b``: if neither fits,
    the product cannot either, and the row multiplies the largest ``a`` to raise the same overflow.
    The branch a row does not take multiplies by 0, so it never fails on its own.
    """
    scale = sa + sb
    limit = Decimal(10) ** (_MAX_DIGITS - scale)  # |product| must stay below it
    a, b = a.cast(pl.Decimal(_MAX_DIGITS, sa)), b.cast(pl.Decimal(_MAX_DIGITS, sb))  # same values, room to clip

    def lit(value: Decimal, s: int) -> pl.Expr:
        return pl.lit(value, dtype=pl.Decimal(_MAX_DIGITS, s))

    def fitted(x: pl.Expr, s: int) -> pl.Expr:  # x at the product scale, clipped where it cannot be
        bound = _WIDE.subtract(limit, Decimal(1).scaleb(-s))
        return x.clip(lit(bound.copy_negate(), s), lit(bound, s)).cast(pl.Decimal(_MAX_DIGITS, scale))

    a_big = a.abs() >= lit(limit, sa)
    largest_a = _WIDE.subtract(Decimal(10) ** (_MAX_DIGITS - sa), Decimal(1).scaleb(-sa))
    a_cast = fitted(a, sa) * pl.when(a_big).then(0).otherwise(b)
    b_cast = pl.when(a_big).then(pl.when(b.abs() >= lit(limit, sb)).then(lit(largest_a, sa))
                                 .otherwise(a)).otherwise(0) * fitted(b, sb)
    return pl.when(a_big).then(b_cast).otherwise(a_cast)


def _literal_like(pattern: str) -> tuple[str, str] | None:
    """The string method for a case-sensitive pattern whose only wildcards are an outer ``%``.

    That is a leading and/or trailing ``%`` (as SQL picks it); else None: the pattern becomes a regex.
    """
    if pattern.startswith("%") and pattern.endswith("%"):
        match = ("contains", pattern[1:-1]) if len(pattern) > 1 and pattern[1:].endswith("%") else None
    elif pattern.endswith("%"):
        match = ("starts_with", pattern[:-1])
    elif pattern.startswith("%"):
        match = ("ends_with", pattern[1:])
    else:
        match = None
    return match if match and match[1] and not any(c in match[1] for c in "%_") else None


def _like_regex(pattern: str, case_insensitive: bool) -> str:
    body = "".join("\\" + c if c in _REGEX_META else c for c in pattern.strip("%"))
    return ("(?is)" if case_insensitive else "(?s)") + ("" if pattern.startswith("%") else "^") + \
        body.replace("%", ".*").replace("_", ".") + ("" if pattern.endswith("%") else "$")


class _Compiler:
    def __init__(self, schema: dict[str, pl.DataType]) -> None:
        self.schema = schema

    def dtype(self, expr: pl.Expr, pos: int) -> pl.DataType:
        try:
            return pl.LazyFrame(schema=self.schema).select(expr).collect_schema().dtypes()[0]
        except pl.exceptions.PolarsError as err:
            raise ExpressionError(f"invalid expression: {first_line(err)}", pos) from None

    def compile(self, node: ast.Node) -> Value:
        method = getattr(self, f"compile_{type(node).__name__.lower()}")
        return method(node)

    def compile_number(self, node: ast.Number) -> Value:
        text = node.text
        if not any(c in text for c in ".eE") and len(text) <= 19 and int(text) <= _I64_MAX:
            return Value(pl.lit(int(text)), "int", int(text), True)
        if "e" in text.lower():
            return Value(pl.lit(float(text)), "float", float(text), True)
        if _exact_digits(text) > _MAX_DIGITS:
            raise ExpressionError(f"numeric literal {text} needs more than {_MAX_DIGITS} digits; use an exponent "
                                  "(e.g. 1.5e40) for an approximate value", node.pos)
        return decimal_literal(Decimal(text))

    def compile_str(self, node: ast.Str) -> Value:
        return Value(pl.lit(node.value), "str", node.value, True)

    def compile_const(self, node: ast.Const) -> Value:
        return Value(pl.lit(node.value), "null" if node.value is None else "bool", node.value, True)

    def compile_column(self, node: ast.Column) -> Value:
        return Value(pl.col(node.name))

    def compile_unary(self, node: ast.Unary) -> Value:
        operand = self.compile(node.operand)
        if node.op == "not":
            return Value(operand.expr.cast(pl.Boolean).not_())
        if operand.kind == "decimal":
            return decimal_literal(operand.value.copy_negate() if node.op == "-" else operand.value)
        if operand.kind in ("int", "float"):
            value = -operand.value if node.op == "-" else operand.value
            return replace(operand, expr=pl.lit(value), value=value)
        return Value(pl.lit(0) - operand.expr if node.op == "-" else pl.lit(0) + operand.expr)

    def compile_binary(self, node: ast.Binary) -> Value:
        folded = self.fold(node) if node.op in ("+", "-", "*") and self.dotted(node) else None
        if folded is not None:
            return decimal_literal(folded)
        left, right = self.compile(node.left), self.compile(node.right)
        if node.op in ("and", "or"):
            return Value(left.expr & right.expr if node.op == "and" else left.expr | right.expr)
        if node.op in ("*", "/", "%"):
            a, b = self.adapt(left, right, node.pos, gated=False)
            return Value({"*": self.multiply, "/": self.divide, "%": self.remainder}[node.op](a, b, node.pos))
        return Value(self.compare(node.op, left, right, node.pos))

    def compare(self, op: str, left: Value, right: Value, pos: int) -> pl.Expr:
        """``+ -`` and the comparisons: the API's operators once SQL's literal rules are applied."""
        if op in ("=", "<>"):
            left, right = self.int_literal_for_string(left, right)
        a, b = self.adapt(left, right, pos, gated=True)
        ops = {"+": pl.Expr.add, "-": pl.Expr.sub, "=": pl.Expr.eq, "<>": lambda x, y: x.eq(y).not_(),
               "<": pl.Expr.lt, "<=": pl.Expr.le, ">": pl.Expr.gt, ">=": pl.Expr.ge}
        return ops[op](a, b)

    def dotted(self, node: ast.Node) -> bool:
        """Whether literal arithmetic ``node`` has a literal with a decimal point (SQL folds it)."""
        return any(isinstance(n, ast.Number) and "." in n.text for n, _ in ast.walk(node))

    def fold(self, node: ast.Node) -> Decimal | None:
        """The exact value of ``+ - *`` over exact literals at SQL's scales, None if not such."""
        if isinstance(node, ast.Number):
            representable = "e" not in node.text.lower() and _exact_digits(node.text) <= _MAX_DIGITS
            return Decimal(node.text) if representable else None
        if isinstance(node, ast.Unary) and node.op in ("+", "-"):
            value = self.fold(node.operand)
            return value.copy_negate() if value is not None and node.op == "-" else value
        if not (isinstance(node, ast.Binary) and node.op in ("+", "-", "*")):
            return None
        left, right = self.fold(node.left), self.fold(node.right)
        if left is None or right is None:
            return None
        sl, sr = _scale(left), _scale(right)
        name, scale = {"+": ("addition", max(sl, sr)), "-": ("subtraction", max(sl, sr)),
                       "*": ("multiplication", sl + sr)}[node.op]
        if scale > _MAX_DIGITS:
            raise ExpressionError(f"numeric value out of range: multiplication result scale {scale} exceeds "
                                  f"{_MAX_DIGITS}", node.pos)
        exact = {"+": _WIDE.add, "-": _WIDE.subtract, "*": _WIDE.multiply}[node.op](left, right)
        value = exact.quantize(Decimal(1).scaleb(-scale), context=_WIDE)
        if abs(value) >= Decimal(10) ** (_MAX_DIGITS - scale):
            raise ExpressionError(f"numeric value out of range: {name} result doesn't fit "
                                  f"Decimal({_MAX_DIGITS}, {scale})", node.pos)
        return value

    def int_literal_for_string(self, left: Value, right: Value) -> tuple[Value, Value]:
        """SQL compares an integer literal with a (column-free) string as the integer's text."""
        def is_string(v: Value) -> bool:
            try:
                return pl.LazyFrame().select(v.expr).collect_schema().dtypes()[0] == pl.String
            except pl.exceptions.PolarsError:
                return False
        if left.kind == "int" and is_string(right):
            return Value(pl.lit(str(left.value)), "str", str(left.value), True), right
        if right.kind == "int" and is_string(left):
            return left, Value(pl.lit(str(right.value)), "str", str(right.value), True)
        return left, right

    def adapt(self, left: Value, right: Value, pos: int, gated: bool) -> tuple[pl.Expr, pl.Expr]:
        """The operands, a literal-valued decimal meeting a float cast to that float.

        ``gated``: only where SQL resolves the operator late, i.e. with a decimal literal operand.
        """
        exprs = [left.expr, right.expr]
        late = not gated or left.decimal_valued or right.decimal_valued
        if (left.literal_valued or right.literal_valued) and late:
            dtypes = [self.dtype(e, pos) for e in exprs]
            for i, value in enumerate((left, right)):
                if value.literal_valued and dtypes[i].is_decimal() and dtypes[1 - i].is_float():
                    exprs[i] = exprs[i].cast(dtypes[1 - i])
        return exprs[0], exprs[1]

    def exact_scales(self, a: pl.Expr, b: pl.Expr, pos: int) -> tuple[int, int] | None:
        """The scales of two exact operands with at least one decimal (integers have scale 0)."""
        dtypes = [self.dtype(a, pos), self.dtype(b, pos)]
        if not all(d.is_decimal() or d.is_integer() for d in dtypes) or not any(d.is_decimal() for d in dtypes):
            return None
        sa, sb = (d.scale if isinstance(d, pl.Decimal) else 0 for d in dtypes)
        return sa, sb

    def multiply(self, a: pl.Expr, b: pl.Expr, pos: int) -> pl.Expr:
        scales = self.exact_scales(a, b, pos)
        if scales is None or min(scales) == 0:
            return a * b
        if sum(scales) > _MAX_DIGITS:
            raise ExpressionError(f"numeric value out of range: multiplication result scale {sum(scales)} "
                                  f"exceeds {_MAX_DIGITS} (CAST an operand to fewer decimals)", pos)
        return exact_mul(a, scales[0], b, scales[1])

    def divide(self, a: pl.Expr, b: pl.Expr, pos: int) -> pl.Expr:
        scales = self.exact_scales(a, b, pos)
        if scales is None:
            return a / b
        sa, sb = scales
        quotient = max(sa, min(sa + 6, 12))
        if sb > quotient:
            raise ExpressionError(f"a divisor with {sb} decimals, more than the {quotient} of the quotient, is not "
                                  f"supported (CAST the dividend to DECIMAL(38, {sb}))", pos)
        shift = quotient - max(sa, sb)  # dividing both by 10^shift brings the API's scale to the quotient's
        if shift:
            tenth = Decimal(1).scaleb(-shift)
            a = a * pl.lit(tenth, dtype=pl.Decimal(_MAX_DIGITS, sa + shift))
            b = b * pl.lit(tenth, dtype=pl.Decimal(_MAX_DIGITS, sb + shift))
        return a / b

    def remainder(self, a: pl.Expr, b: pl.Expr, pos: int) -> pl.Expr:
        dtypes = [self.dtype(a, pos), self.dtype(b, pos)]
        if not all(d.is_numeric() for d in dtypes):
            return a % b
        if any(d.is_float() for d in dtypes):
            raise ExpressionError("'%' of an approximate (float) value is not supported", pos)
        if any(d.is_decimal() for d in dtypes):  # on magnitudes: a floored remainder can overflow
            a, b = (e if d.is_decimal() else e.cast(pl.Decimal(_MAX_DIGITS, 0)) for e, d in zip((a, b), dtypes, strict=True))
            magnitude = a.abs() % b.abs()
            return pl.when(a < 0).then(pl.lit(0) - magnitude).otherwise(magnitude)
        floored = a % b  # the API's remainder has the divisor's sign, SQL's the dividend's
        return pl.when((floored != 0) & ((floored < 0) != (a < 0))).then(floored - b).otherwise(floored)

    def compile_between(self, node: ast.Between) -> Value:
        e, low, high = (self.compile(n).expr for n in (node.operand, node.low, node.high))
        return Value((e < low) | (e > high) if node.negated else (e >= low) & (e <= high))

    def compile_inlist(self, node: ast.InList) -> Value:
        """SQL's ``IN``: an ``OR`` of equalities (so a NULL in the list makes a miss unknown).

        A list of literals is one typed list in SQL: numbers among strings read as strings, and a column
        of strings cannot be looked up among numbers (nor numbers among strings).
        """
        needle = self.compile(node.operand)
        items = [self.compile(item) for item in node.items]
        kinds = {item.kind for item in items} - {"null"}
        if all(item.kind for item in items) and "str" in kinds and len(kinds) > 1:
            if kinds != {"str", "int"}:
                raise ExpressionError("the values of an IN list must all be numbers or all strings", node.pos)
            items = [Value(pl.lit(str(i.value)), "str", str(i.value), True) if i.kind == "int" else i for i in items]
            kinds = {"str"}
        reads_column = any(isinstance(n, ast.Column) for n, _ in ast.walk(node.operand))
        if all(item.kind for item in items) and kinds and reads_column:
            dtype = self.dtype(needle.expr, node.pos)
            if (dtype == pl.String) != (kinds == {"str"}):
                listed = "strings" if kinds == {"str"} else "numbers"
                raise ExpressionError(f"invalid expression: {dtype} values cannot be looked up in a list of {listed}",
                                      node.pos)
        matches = []
        for item, value in zip(node.items, items, strict=True):
            left, right = self.int_literal_for_string(needle, value)
            matches.append(pl.Expr.eq(*self.adapt(left, right, item.pos, gated=False)))
        found = reduce(pl.Expr.or_, matches)
        return Value(found.not_() if node.negated else found)

    def compile_like(self, node: ast.Like) -> Value:
        pattern, operand = self.compile(node.pattern), self.compile(node.operand)
        if pattern.kind != "str":
            raise ExpressionError("a LIKE/ILIKE pattern must be a string literal", node.pattern.pos)
        text, e = pattern.value, operand.expr
        if not text or (not node.case_insensitive and "%" not in text and "_" not in text):
            return Value(self.compare("<>" if node.negated else "=", operand, pattern, node.pos))
        match = None if node.case_insensitive else _literal_like(text)
        if match is not None:
            method, needle = match
            found = e.str.contains(needle, literal=True) if method == "contains" else getattr(e.str, method)(needle)
        else:
            found = e.str.contains(_like_regex(text, node.case_insensitive), strict=True)
        return Value(found.not_() if node.negated else found)

    def compile_isnull(self, node: ast.IsNull) -> Value:
        e = self.compile(node.operand).expr
        return Value(e.is_not_null() if node.negated else e.is_null())

    def compile_case(self, node: ast.Case) -> Value:
        operand = None if node.operand is None else self.compile(node.operand).expr
        results = []
        chain: Any = pl  # then pl.when(...).then(...) and its chained forms: each has when/otherwise
        for condition, result in node.branches:
            test = self.compile(condition).expr
            results.append(self.compile(result))
            chain = chain.when(test if operand is None else operand.eq(test)).then(results[-1].expr)
        default = self.compile(node.default) if node.default is not None else NULL
        return ternary(chain.otherwise(default.expr), [*results, default])

    def compile_cast(self, node: ast.Cast) -> Value:
        return Value(self.compile(node.operand).expr.cast(node.dtype))

    def compile_call(self, node: ast.Call) -> Value:
        return call(node, [self.compile(a) for a in node.args], lambda e: self.dtype(e, node.pos))


def labels_of(tree: ast.Node) -> frozenset[str]:
    """The label columns ``tree`` reads."""
    return frozenset(n.name for n, _ in ast.walk(tree)
                     if isinstance(n, ast.Column) and n.name.startswith((GROUPBY_PREFIX, METADATA_PREFIX)))
