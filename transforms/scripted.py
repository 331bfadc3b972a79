"""Scripted rating: what CloudKitty's PyScripts module is used for, without running user code.

CloudKitty ``exec``s Python scripts on each frame (spec §5); ratebeam never runs user text.  A
script is JSON whose steps are Polars SQL expressions, compiled with ``polars.sql_expr`` and
checked node by node against an allow-list of row-wise operations, so a script can only compute
new values of a point from that same point's columns.

Grammar::

    {"name": "<non-empty string>",
     "steps": [{"set": "price" | "qty",
                "expr": "<Polars SQL expression>",
                "where": "<optional Polars SQL boolean expression>"}, ...]}

- Columns a script may read: ``scope_id``, ``type``, ``begin``, ``end``, ``qty``, ``price``,
  ``unit`` and the label columns ``"groupby.<key>"`` / ``"metadata.<key>"`` (double-quote them:
  the dot is part of the name).  A label column a batch does not have reads as NULL (the point has
  no such key).  No other column exists for a script.
- Allowed: literals (``1.5`` is an exact decimal), ``+ - * / %``, comparisons, ``AND OR NOT``,
  ``IN (...)``, ``BETWEEN``, ``LIKE`` / ``ILIKE``, ``IS [NOT] NULL``, ``CASE``, ``IF``, ``CAST`` /
  ``::``, ``COALESCE``, ``NULLIF``, ``GREATEST``, ``LEAST``, ``ABS``, ``SIGN``, ``ROUND``, ``FLOOR``,
  ``CEIL``, string functions (``UPPER``, ``LOWER``, ``LENGTH``, ``SUBSTR``, ``REPLACE``, ``TRIM``,
  ``STARTS_WITH``, ``ENDS_WITH``, ``SPLIT_PART``, ``STRPOS``, ...), date parts (``EXTRACT``,
  ``DATE_PART``, ``STRFTIME``).
- Refused when the script is loaded: aggregates (``SUM``, ``COUNT``...), window functions
  (``OVER``), sub-queries and table functions, unknown columns, a ``set`` target other than
  ``price`` / ``qty``, an ``expr`` whose type is not a decimal or an integer (floats are not exact:
  write ``1.5``, not ``1.5e0``), a ``where`` that is not boolean, unknown keys.
- Steps run in order, each seeing the previous steps' results; where ``where`` is false or NULL the
  column keeps its value.  Results are cast to the batch types (``price`` decimal(38,20), ``qty``
  decimal(38,18)), rounding half-even; ``/`` rounds to the scale of its operands, everything else
  is exact.  Polars SQL multiplies decimals at the sum of their scales: a result scale above 38
  (``qty * 0.000000000000000000125`` is 18 + 21) is refused at load time; ``CAST`` an operand to
  fewer decimals.  A value that does not fit its type fails its frame at rating time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from ratebeam.transforms.schema import (
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    polars_core_schema,
)

_TARGETS = {PRICE: polars_core_schema()[PRICE], QTY: polars_core_schema()[QTY]}
_SCRIPT_KEYS = frozenset({"name", "steps"})
_STEP_KEYS = frozenset({"set", "expr", "where"})

# Allow-list of Polars expression nodes (as serialized by ``Expr.meta.serialize``): every one is
# row-wise.  Anything else (aggregations, windows, sub-plans, ranges, shifts...) is refused.
_FUNCTIONS = frozenset({"Abs", "Sign", "Floor", "Ceil", "MaxHorizontal", "MinHorizontal", "Coalesce", "FillNull",
                        "Log", "Exp"})
_FUNCTION_FAMILIES = {
    "Sql": frozenset({"Binary", "Round", "IsIn", "ToFloat"}),
    "Boolean": frozenset({"Not", "IsNull", "IsNotNull", "IsNan", "IsNotNan", "IsFinite", "IsInfinite",
                          "IsBetween", "IsIn", "AllHorizontal", "AnyHorizontal"}),
    "StringExpr": frozenset({"Uppercase", "Lowercase", "Titlecase", "LenChars", "LenBytes", "Slice", "Head",
                             "Tail", "StartsWith", "EndsWith", "Contains", "Replace", "StripChars",
                             "StripCharsStart", "StripCharsEnd", "Reverse", "Find", "Split", "ZFill",
                             "PadStart", "PadEnd"}),
    "TemporalExpr": None,  # every temporal function is row-wise
    "Pow": None,
    "ListExpr": frozenset({"Get"}),  # only after Split, as SPLIT_PART does
}


# Sub-queries are refused before the text reaches Polars: compiling one already runs its table
# functions (``read_csv('/etc/...')`` opens the file).  Literals, quoted names and comments are
# blanked first so that a value like 'select' stays usable.
_BLANKED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)
_FORBIDDEN = re.compile(r"\bselect\b|\b(?:read|scan)_\w*\s*\(", re.IGNORECASE)


class ScriptError(ValueError):
    """A script that cannot be loaded: ``location`` is the key path (``steps[1].expr``)."""

    def __init__(self, location: str, message: str) -> None:
        self.location = location
        self.message = message
        super().__init__(f"{location}: {message}" if location else message)


@dataclass(frozen=True)
class Step:
    """One compiled step: ``target = expr`` where ``where`` holds (always when ``where`` is None)."""

    target: str
    expr: pl.Expr
    where: pl.Expr | None
    labels: frozenset[str]  # label columns it reads


@dataclass(frozen=True)
class Script:
    """A loaded script: checked at load time, applied to any usage batch."""

    name: str
    steps: tuple[Step, ...]

    def apply(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The batch with every step applied (row-wise, so batching never changes a result)."""
        missing = sorted({c for step in self.steps for c in step.labels} - set(frame.columns))
        lazy = frame.lazy().with_columns(pl.lit(None, dtype=pl.String).alias(c) for c in missing)
        for step in self.steps:
            value = step.expr.cast(_TARGETS[step.target])
            if step.where is not None:
                value = pl.when(step.where).then(value).otherwise(pl.col(step.target))
            lazy = lazy.with_columns(value.alias(step.target))
        return lazy.drop(missing).collect(engine="in-memory")


def load_script(text: str) -> Script:
    """Parse and check a script's JSON text (see the module docstring); ``ScriptError`` if refused."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ScriptError(f"line {err.lineno} column {err.colno}", f"invalid JSON: {err.msg}") from None
    return script_from_json(raw)


def script_from_json(raw: Any) -> Script:
    """Check an already-parsed script document (e.g. one entry of a configuration file)."""
    _check_keys(raw, "", _SCRIPT_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError("name", "must be a non-empty string")
    steps = raw.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ScriptError("steps", "must be a non-empty list")
    return Script(name, tuple(_step(step, f"steps[{i}]") for i, step in enumerate(steps)))


def apply_scripts(frame: pl.DataFrame, scripts: tuple[Script, ...]) -> pl.DataFrame:
    """Apply scripts in order, each to the previous one's output (CloudKitty's DB order)."""
    for script in scripts:
        frame = script.apply(frame)
    return frame


def _check_keys(raw: Any, where: str, keys: frozenset[str]) -> None:
    if not isinstance(raw, dict):
        raise ScriptError(where, "must be a JSON object")
    for key in raw:
        if key not in keys:
            raise ScriptError(f"{where}.{key}" if where else key,
                              f"unknown key (expected one of {', '.join(sorted(keys))})")


def _step(raw: Any, where: str) -> Step:
    _check_keys(raw, where, _STEP_KEYS)
    target = raw.get("set")
    if target not in _TARGETS:
        raise ScriptError(f"{where}.set", f"can only set 'price' or 'qty', not {target!r}")
    expr, labels = _compile(raw.get("expr"), f"{where}.expr")
    dtype = _result_type(expr, labels, f"{where}.expr")
    if not (dtype.is_decimal() or dtype.is_integer()):
        raise ScriptError(f"{where}.expr", f"must give a decimal or an integer (exact), not {dtype}")
    condition = None
    if raw.get("where") is not None:
        condition, more = _compile(raw["where"], f"{where}.where")
        dtype = _result_type(condition, more, f"{where}.where")
        if dtype != pl.Boolean:
            raise ScriptError(f"{where}.where", f"must be a boolean condition, not {dtype}")
        labels |= more
    return Step(target, expr, condition, labels)


def _compile(text: Any, where: str) -> tuple[pl.Expr, frozenset[str]]:
    if not isinstance(text, str) or not text.strip():
        raise ScriptError(where, "must be a non-empty SQL expression string")
    if _FORBIDDEN.search(_BLANKED.sub("''", text)):
        raise ScriptError(where, "sub-queries and table functions are refused")
    try:
        expr = pl.sql_expr(text)
        tree = json.loads(expr.meta.serialize(format="json"))
    except Exception as err:  # Polars raises several types for bad SQL
        raise ScriptError(where, f"not a supported SQL expression: {_first_line(err)}") from None
    columns = set(_nodes_columns(tree, where))
    core = tuple(polars_core_schema())
    labels = {c for c in columns if c.startswith((GROUPBY_PREFIX, METADATA_PREFIX))}
    unknown = sorted(columns - set(core) - labels)
    if unknown:
        raise ScriptError(where, f"unknown column {unknown[0]!r} (a script reads {', '.join(core)} and "
                                 '"groupby.<key>" / "metadata.<key>")')
    return expr, frozenset(labels)


def _result_type(expr: pl.Expr, labels: frozenset[str], where: str) -> pl.DataType:
    schema = polars_core_schema() | {c: pl.String() for c in labels}
    try:
        return pl.LazyFrame(schema=schema).select(expr).collect_schema().dtypes()[0]
    except Exception as err:  # a type error in the expression
        raise ScriptError(where, f"invalid expression: {_first_line(err)}") from None


def _nodes_columns(node: Any, where: str) -> Iterator[str]:
    """Yield the columns a serialized expression reads, refusing any node not in the allow-list."""
    if not isinstance(node, dict) or len(node) != 1:
        raise ScriptError(where, _unsupported(node))
    (kind, body), = node.items()
    if kind == "Column":
        yield body
    elif kind == "Literal":
        return
    elif kind == "BinaryExpr":
        yield from _nodes_columns(body["left"], where)
        yield from _nodes_columns(body["right"], where)
    elif kind == "Ternary":
        for part in ("predicate", "truthy", "falsy"):
            yield from _nodes_columns(body[part], where)
    elif kind == "Cast":
        yield from _nodes_columns(body["expr"], where)
    elif kind == "Function" and _allowed_function(body["function"]):
        for item in body["input"]:
            yield from _nodes_columns(item, where)
    else:
        raise ScriptError(where, _unsupported(node))


def _allowed_function(function: Any) -> bool:
    if isinstance(function, str):
        return function in _FUNCTIONS
    if isinstance(function, dict) and len(function) == 1:
        (family, inner), = function.items()
        if family not in _FUNCTION_FAMILIES:
            return False
        allowed = _FUNCTION_FAMILIES[family]
        name = inner if isinstance(inner, str) else next(iter(inner), None) if isinstance(inner, dict) else None
        return allowed is None or name in allowed
    return False


def _unsupported(node: Any) -> str:
    what = str(node)[:60]
    if isinstance(node, dict) and len(node) == 1:
        kind, body = next(iter(node.items()))
        what = json.dumps(body.get("function"))[:60] if kind == "Function" else kind
    return (f"unsupported construct {what!r} (only row-wise operations are allowed: no aggregates, "
            "windows or sub-queries)")


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
