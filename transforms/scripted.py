"""Scripted rating: what CloudKitty's PyScripts module is used for, without running user code.

CloudKitty ``exec``s Python scripts on each frame (`cloudkitty/orchestrator.py:257-265`); ratebeam never runs user text, and
never hands it to an engine that can reach files either: a step's expression is parsed by the
closed grammar of ``transforms.script_parser`` and built into a Polars expression by
``transforms.script_compiler``, so a script can only compute new values of a point from that same
point's columns.  (Compiling it as Polars SQL, as before, ran the table functions a sub-query
names, ``read_csv('/etc/...')`` included, while compiling.)

Document (checked by a pydantic model: no other keys, no other types)::

    {"name": "<non-empty string>",
     "steps": [{"set": "price" | "qty",
                "expr": "<expression>",
                "where": "<optional boolean expression>"}, ...]}

- Columns a script may read: ``scope_id``, ``type``, ``begin``, ``end``, ``qty``, ``price``,
  ``unit`` and the label columns ``"groupby.<key>"`` / ``"metadata.<key>"`` (double-quote them:
  the dot is part of the name).  A label column a batch does not have reads as NULL (the point has
  no such key).  No other column exists for a script.
- The language is the SQL expression subset scripts were written in, with Polars SQL's results:
  literals (``1.5`` is an exact decimal), ``+ - * / %``, comparisons, ``AND OR NOT``, ``IN (...)``,
  ``BETWEEN``, ``LIKE`` / ``ILIKE``, ``IS [NOT] NULL``, ``CASE``, ``IF``, ``CAST`` / ``::``,
  ``COALESCE``, ``NULLIF``, ``GREATEST``, ``LEAST``, ``ABS``, ``SIGN``, ``ROUND``, ``FLOOR``,
  ``CEIL``, string functions (``UPPER``, ``LOWER``, ``INITCAP``, ``LENGTH``, ``OCTET_LENGTH``,
  ``SUBSTR``, ``REPLACE``, ``TRIM``, ``LTRIM``, ``RTRIM``, ``REVERSE``, ``STARTS_WITH``,
  ``ENDS_WITH``, ``SPLIT_PART``, ``STRPOS``), date parts (``EXTRACT``, ``DATE_PART``: year,
  isoyear, quarter, month, week, doy, dow, isodow, day, hour, minute, second; ``STRFTIME``).
  ``ROUND``'s decimals, ``SUBSTR``'s start and length and ``SPLIT_PART``'s index are integer
  literals; the literals of an ``IN`` list are all numbers or all strings (integers among strings
  read as strings, as in SQL).  A step is at most 1000 tokens and 64 levels deep.  Not in the language (no script or example used them, and some have no exact
  mapping): ``POWER``, ``SQRT``, ``LN``, ``LOG``, ``EXP``, ``MOD``, ``DIV``, ``CONCAT``, ``||``,
  ``LPAD``/``RPAD``, ``LEFT``/``RIGHT``, ``REGEXP_LIKE``, ``TRY_CAST``, casts to date/time types,
  ``EXTRACT(EPOCH ...)``, ``%`` of a float.
- Refused when the script is loaded, with the step and the column: aggregates (``SUM``,
  ``COUNT``...), windows (``OVER``), sub-queries (``SELECT``, ``FROM``, ``WITH``...), table
  functions (``read_csv``, ``scan_parquet``...), unknown functions or columns, dollar-quoted or
  prefixed strings (``$$x$$``, ``E'x'``), comments, ``;``, a ``set`` target other than ``price`` /
  ``qty``, an ``expr`` whose type is not a decimal or an integer (floats are not exact: write
  ``1.5``, not ``1.5e0``), a ``where`` that is not boolean, unknown keys.
- Steps run in order, each seeing the previous steps' results; where ``where`` is false or NULL the
  column keeps its value.  Results are cast to the batch types (``price`` decimal(38,20), ``qty``
  decimal(38,18)), rounding half-even.  Decimal ``*`` is exact at the sum of the scales: a result
  scale above 38 (``qty * 0.000000000000000000125`` is 18 + 21) is refused at load time; ``CAST``
  an operand to fewer decimals.  ``/`` rounds half-even to ``max(s1, min(s1 + 6, 12))`` decimals
  (``s1`` the dividend's); a divisor with more decimals than that is refused (``1 / qty``: write
  ``CAST(1 AS DECIMAL(38, 18)) / qty``).  A value that does not fit its type fails its frame at
  rating time.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ratebeam.transforms.schema import PRICE, QTY, polars_core_schema
from ratebeam.transforms.script_compiler import compile_tree, labels_of
from ratebeam.transforms.script_parser import parse
from ratebeam.transforms.script_syntax import ExpressionError, first_line

_TARGETS = {PRICE: polars_core_schema()[PRICE], QTY: polars_core_schema()[QTY]}


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


class _StepDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    target: Literal["price", "qty"] = Field(alias="set")
    expr: str
    where: str | None = None


class _ScriptDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1)
    steps: list[_StepDocument] = Field(min_length=1)


_KEYS = {"": "name, steps", "step": "expr, set, where"}
_MESSAGES = {"name": "must be a non-empty string", "steps": "must be a non-empty list",
             "expr": "must be a non-empty SQL expression string", "where": "must be a non-empty SQL expression string"}


def load_script(text: str) -> Script:
    """Parse and check a script's JSON text (see the module docstring); ``ScriptError`` if refused."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ScriptError(f"line {err.lineno} column {err.colno}", f"invalid JSON: {err.msg}") from None
    except RecursionError:  # json's decoder recurses: a hostile file nests deeper than it can follow
        raise ScriptError("", "invalid JSON: nested too deeply") from None
    except ValueError:  # an integer over Python's 4,300-digit conversion limit
        raise ScriptError("", f"invalid JSON: a number has more than {sys.get_int_max_str_digits()} digits") from None
    return script_from_json(raw)


def script_from_json(raw: Any) -> Script:
    """Check an already-parsed script document (e.g. one entry of a configuration file)."""
    try:
        document = _ScriptDocument.model_validate(raw)
    except ValidationError as err:
        raise _document_error(err) from None
    return Script(document.name, tuple(_step(step, f"steps[{i}]") for i, step in enumerate(document.steps)))


def apply_scripts(frame: pl.DataFrame, scripts: tuple[Script, ...]) -> pl.DataFrame:
    """Apply scripts in order, each to the previous one's output (CloudKitty's DB order)."""
    for script in scripts:
        frame = script.apply(frame)
    return frame


def _document_error(err: ValidationError) -> ScriptError:
    """The first problem pydantic found, as today's message: unknown keys of an object come first."""
    def rank(error: Any) -> tuple[int, int]:
        loc = error["loc"]
        step = loc[1] if len(loc) > 2 or (len(loc) == 2 and isinstance(loc[1], int)) else -1
        return step, 0 if error["type"] == "extra_forbidden" else 1

    error = sorted(err.errors(), key=rank)[0]
    loc = error["loc"]
    location = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    field = loc[-1] if loc else ""
    if error["type"] == "extra_forbidden":
        return ScriptError(location, f"unknown key (expected one of {_KEYS['step' if len(loc) > 1 else '']})")
    if error["type"] in ("model_type", "model_attributes_type") or isinstance(field, int) or not loc:
        return ScriptError(location, "must be a JSON object")
    if field == "set":
        value = None if error["type"] == "missing" else error["input"]
        return ScriptError(location, f"can only set 'price' or 'qty', not {value!r}")
    return ScriptError(location, _MESSAGES[str(field)])


def _step(document: _StepDocument, where: str) -> Step:
    expr, labels = _compile(document.expr, f"{where}.expr")
    dtype = _result_type(expr, labels, f"{where}.expr")
    if not (dtype.is_decimal() or dtype.is_integer()):
        raise ScriptError(f"{where}.expr", f"must give a decimal or an integer (exact), not {dtype}")
    condition = None
    if document.where is not None:
        condition, more = _compile(document.where, f"{where}.where")
        dtype = _result_type(condition, more, f"{where}.where")
        if dtype != pl.Boolean:
            raise ScriptError(f"{where}.where", f"must be a boolean condition, not {dtype}")
        labels |= more
    return Step(document.target, expr, condition, labels)


def _compile(text: str, where: str) -> tuple[pl.Expr, frozenset[str]]:
    if not text.strip():
        raise ScriptError(where, "must be a non-empty SQL expression string")
    try:
        tree = parse(text)
    except ExpressionError as err:
        raise ScriptError(where, f"not a supported SQL expression: {err}") from None
    labels = labels_of(tree)
    try:
        return compile_tree(tree, _schema(labels)), labels
    except ExpressionError as err:
        raise ScriptError(where, str(err)) from None


def _schema(labels: frozenset[str]) -> dict[str, pl.DataType]:
    return polars_core_schema() | {c: pl.String() for c in labels}


def _result_type(expr: pl.Expr, labels: frozenset[str], where: str) -> pl.DataType:
    try:
        return pl.LazyFrame(schema=_schema(labels)).select(expr).collect_schema().dtypes()[0]
    except pl.exceptions.PolarsError as err:  # a type error in the expression
        raise ScriptError(where, f"invalid expression: {first_line(err)}") from None
