"""The function library of scripted-rating expressions, and the compiled value they work on.

Each function builds the expression Polars SQL (2.1) built for it, so scripts keep their results;
the arguments SQL only accepted as literals (``ROUND``'s decimals, ``SUBSTR``'s start and length,
``SPLIT_PART``'s index, date part names, ``STRFTIME``'s format) must be literals here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

from ratebeam.transforms import script_syntax as ast
from ratebeam.transforms.script_syntax import ExpressionError

_DATE_PARTS = {
    **dict.fromkeys(("year", "years", "y"), lambda e: e.dt.year()),
    "isoyear": lambda e: e.dt.iso_year(),
    **dict.fromkeys(("quarter", "quarters"), lambda e: e.dt.quarter()),
    **dict.fromkeys(("month", "months", "mon", "mons"), lambda e: e.dt.month()),
    **dict.fromkeys(("week", "weeks", "isoweek"), lambda e: e.dt.week()),
    **dict.fromkeys(("doy", "dayofyear"), lambda e: e.dt.ordinal_day()),
    **dict.fromkeys(("dow", "dayofweek"), lambda e: pl.when(e.dt.weekday() == pl.lit(7, pl.Int8))
                    .then(pl.lit(0, pl.Int8)).otherwise(e.dt.weekday())),
    "isodow": lambda e: e.dt.weekday(),
    **dict.fromkeys(("day", "days", "dayofmonth", "d"), lambda e: e.dt.day()),
    **dict.fromkeys(("hour", "hours", "h"), lambda e: e.dt.hour()),
    **dict.fromkeys(("minute", "minutes", "mins", "min", "m"), lambda e: e.dt.minute()),
    **dict.fromkeys(("second", "seconds", "sec", "secs", "s"), lambda e: e.dt.second()),
}
_UNARY_FUNCTIONS = {
    "abs": pl.Expr.abs, "sign": pl.Expr.sign, "floor": pl.Expr.floor, "ceil": pl.Expr.ceil,
    "ceiling": pl.Expr.ceil, "upper": lambda e: e.str.to_uppercase(), "lower": lambda e: e.str.to_lowercase(),
    "initcap": lambda e: e.str.to_titlecase(), "length": lambda e: e.str.len_chars(),
    "char_length": lambda e: e.str.len_chars(), "octet_length": lambda e: e.str.len_bytes(),
    "reverse": lambda e: e.str.reverse(), "trim": lambda e: e.str.strip_chars(None),
    "ltrim": lambda e: e.str.strip_chars_start(None), "rtrim": lambda e: e.str.strip_chars_end(None),
}
_VARIADIC_FUNCTIONS: dict[str, Callable[[list[pl.Expr]], pl.Expr]] = {
    "coalesce": pl.coalesce, "greatest": pl.max_horizontal, "least": pl.min_horizontal,
}


@dataclass(frozen=True)
class Value:
    """A compiled operand: ``kind`` and ``value`` for a literal (``kind`` is empty otherwise)."""

    expr: pl.Expr
    kind: str = ""  # "int" | "decimal" | "float" | "str" | "bool" | "null"
    value: Any = None
    literal_valued: bool = False  # a literal, or a CASE of them: it takes a float operand's type
    decimal_valued: bool = False  # SQL's gate for that: a decimal literal, or a CASE of literals with one


NULL = Value(pl.lit(None), "null", None, True)


def ternary(expr: pl.Expr, results: list[Value]) -> Value:
    """``when ... then results[0] ... otherwise results[-1]``, with SQL's literal-valued flags."""
    rest = results[-1]
    for result in reversed(results[:-1]):  # the chain nests: when(c1, r1, when(c2, r2, default))
        branches = (result, rest)
        rest = Value(expr, literal_valued=all(b.literal_valued for b in branches),
                     decimal_valued=all(b.kind or b.decimal_valued for b in branches)
                     and any(b.decimal_valued for b in branches))
    return rest


def call(node: ast.Call, args: list[Value], dtype: Callable[[pl.Expr], pl.DataType]) -> Value:
    """The value of function call ``node`` on compiled ``args`` (``dtype`` types an expression)."""
    e = [a.expr for a in args]
    name = node.name
    if name in _UNARY_FUNCTIONS:
        return Value(_UNARY_FUNCTIONS[name](e[0]))
    if name in _VARIADIC_FUNCTIONS:
        return Value(_VARIADIC_FUNCTIONS[name](e))
    if name in ("if", "nullif"):
        results = args[1:] if name == "if" else [NULL, args[0]]
        test = e[0] if name == "if" else e[0].eq(e[1])
        return ternary(pl.when(test).then(results[0].expr).otherwise(results[1].expr), results)
    if name == "round":
        decimals = _literal(node, args, 1, "int") if len(args) == 2 else 0
        if decimals < 0:
            raise ExpressionError("ROUND does not support negative decimals", node.pos)
        mode: Literal["half_away_from_zero", "half_to_even"] = (
            "half_away_from_zero" if dtype(e[0]).is_decimal() else "half_to_even"
        )
        return Value(e[0].round(decimals, mode=mode))
    if name in ("substr", "substring"):
        return Value(_substring(node, args))
    if name == "replace":
        return Value(e[0].str.replace_all(e[1], e[2], literal=True))
    if name in ("starts_with", "ends_with"):
        return Value(e[0].str.starts_with(e[1]) if name == "starts_with" else e[0].str.ends_with(e[1]))
    if name == "strpos":
        one, zero = pl.lit(1, dtype=pl.UInt32), pl.lit(0, dtype=pl.UInt32)
        return Value((e[0].str.find(e[1], literal=False, strict=True) + one).fill_null(zero))
    if name == "split_part":
        index = _literal(node, args, 2, "int")
        part = pl.lit(None) if index == 0 else pl.lit(index - 1 if index > 0 else index)
        piece = e[0].str.split(e[1]).list.get(part, null_on_oob=True).fill_null(pl.lit(""))
        return Value(pl.when(e[0].is_not_null()).then(piece).otherwise(e[0]))
    if name == "strftime":
        return Value(e[0].dt.strftime(_literal(node, args, 1, "str")))
    part = _literal(node, args, 0, "str").lower()  # date_part
    if part not in _DATE_PARTS:
        raise ExpressionError(f"unsupported date part {part!r} (expected one of "
                              f"{', '.join(sorted(_DATE_PARTS))})", node.args[0].pos)
    return Value(_DATE_PARTS[part](e[1]))


def _literal(node: ast.Call, args: list[Value], index: int, kind: str) -> Any:
    if args[index].kind != kind:
        what = "an integer" if kind == "int" else "a string"
        raise ExpressionError(f"argument {index + 1} of {node.name.upper()} must be {what} literal",
                              node.args[index].pos)
    return args[index].value


def _substring(node: ast.Call, args: list[Value]) -> pl.Expr:
    text, start = args[0].expr, _literal(node, args, 1, "int")
    if len(args) == 2:
        return text if start <= 0 else text.str.slice(start - 1, None)
    length = _literal(node, args, 2, "int")
    if length < 0:
        raise ExpressionError("SUBSTR does not support a negative length", node.args[2].pos)
    if start > 0:
        return text.str.slice(pl.lit(start - 1), pl.lit(length))
    return text.str.slice(pl.lit(0), (pl.lit(length) + pl.lit(start - 1)).clip(lower_bound=0))
