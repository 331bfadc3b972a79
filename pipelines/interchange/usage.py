"""Usage JSONL (interchange.md): one point per line (or a JSON list, or ``{"points": [...]}``).

Each point is validated by the ``Point`` model; an error names the point as the user finds it in
the file (``line 3``, ``[2]``, ``points[2]``) then the key: ``usage.jsonl: line 3.qty: not a
decimal: 'x'``.  Quantities and prices are exact decimals at the scale of the usage batches.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import polars as pl
from pydantic import AfterValidator, BeforeValidator, RootModel, model_validator

from ratebeam.connectors.config_model import NOTHING, ExactDecimal, Instant, Invalid, kind
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange.document import WIDE, Document, Name, json_list, load_json, read_text
from ratebeam.pipelines.validation import validate
from ratebeam.transforms.hashmap import DECIMAL_PREFIX, decimal_column
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    PRICE,
    PRICE_POLARS,
    PRICE_SCALE,
    QTY,
    QTY_POLARS,
    QTY_SCALE,
    SCOPE,
    TIME_POLARS,
    TYPE,
    UNIT,
    groupby_column,
    metadata_column,
)

#: Column of the usage frame holding each point's position in the input (0-based).
INDEX = "i"

#: A label: ``str(value)`` and the text of ``Decimal(value)`` when that differs from it, else None.
Label = tuple[str, str | None]


def _scaled(scale: int) -> AfterValidator:
    """A qty or price at the batch scale (rounded half-even), refused when it does not fit."""
    limit = Decimal(10) ** (38 - scale)

    def check(number: Decimal) -> Decimal:
        if number.copy_abs() < limit:
            scaled = number.quantize(Decimal(1).scaleb(-scale), context=WIDE)
            if abs(scaled) < limit:
                return scaled
        raise Invalid(f"does not fit decimal(38, {scale})")

    return AfterValidator(check)


def _typed_label(value: Any) -> Label:
    """CloudKitty matches a non-string label as ``str(value)`` but compares it as ``Decimal(value)``."""
    if isinstance(value, str):
        return value, None
    text = str(value)
    try:
        number = str(Decimal(value))
    except (TypeError, ValueError, decimal.InvalidOperation):
        return text, None  # Decimal() raises in CloudKitty too, and so does Decimal(text)
    return text, None if number == text else number


def _labels(value: Any) -> dict[str, Label]:
    """Labels are a string map (interchange.md); a number or boolean is kept as CloudKitty matches it.

    An object or a list is refused: no rule matches it as CloudKitty would (it would be priced as
    the text of a Python dict), and the file collector refuses such a sample too.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Invalid(f"must be an object, not {kind(value)}", NOTHING)
    for key, item in value.items():
        if isinstance(item, dict | list):
            raise Invalid(f"must be a string or a number, not {kind(item)}", NOTHING, (key,))
    return {key: _typed_label(item) for key, item in value.items()}


def _unit(value: Any) -> str:
    if value is not None and not isinstance(value, str):
        raise Invalid(f"must be a string, not {kind(value)}", NOTHING)
    return value or "undefined"


Labels = Annotated[dict[str, Label], BeforeValidator(_labels)]


class Point(Document):
    """One usage point; ``scope`` defaults to ``groupby.project_id`` (as CloudKitty's scope key)."""

    type: Name
    qty: Annotated[ExactDecimal, _scaled(QTY_SCALE)]
    begin: Instant
    end: Instant
    groupby: Labels = {}
    metadata: Labels = {}
    unit: Annotated[str, BeforeValidator(_unit)] = "undefined"
    scope: Name | None = None
    price: Annotated[ExactDecimal, _scaled(PRICE_SCALE)] = Decimal(0)

    @model_validator(mode="after")
    def _after_begin(self) -> Point:
        """A point's period ends after it begins (one that does not would be priced as a whole period)."""
        if self.end <= self.begin:
            raise Invalid(f"must be after begin ({self.begin.isoformat()})", self.end.isoformat(), ("end",))
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_scope(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("scope") is not None:
            return data
        groupby = data.get("groupby")
        if isinstance(groupby, dict) and "project_id" in groupby:
            return {**data, "scope": _typed_label(groupby["project_id"])[0]}
        return data


class _Points(Document):
    points: json_list(Point)


_PointList = RootModel[tuple[Point, ...]]
_PointLines = RootModel[dict[str, Point]]


def _points(text: str, source: str) -> tuple[Point, ...]:
    """The points of a JSON list, a ``{"points": [...]}`` object or JSONL text, in order."""
    head = text.lstrip()[:1]
    if head == "[":
        return validate(_PointList, load_json(text, source, exact_numbers=False), source).root
    if head == "{":
        try:
            whole = load_json(text, source, exact_numbers=False)
        except InputError:
            whole = None  # not one JSON document: JSONL
        if isinstance(whole, dict) and "points" in whole:
            return validate(_Points, whole, source).points
        if whole is not None:  # one point, on one line or several
            return _lines({text[:len(text) - len(text.lstrip())].count("\n") + 1: whole}, source)
    lines = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            lines[number] = load_json(line, source, exact_numbers=False, line=number)
    return _lines(lines, source)


def _lines(points: dict[int, Any], source: str) -> tuple[Point, ...]:
    return validate_points({f"line {n}": p for n, p in points.items()}, source)


def validate_points(points: dict[str, Any], source: str) -> tuple[Point, ...]:
    """Validate raw points keyed by where the user finds them (``line 3``, ``row 2``...), in order."""
    return tuple(validate(_PointLines, points, source).root.values())


def read_usage(path: str | Path) -> pl.DataFrame:
    """Read usage JSONL (or a JSON list, or ``{"points": [...]}``) into a usage frame."""
    return parse_usage(read_text(path), str(path))


def parse_usage(text: str, source: str) -> pl.DataFrame:
    """Parse usage text into a frame with the columns of ``transforms.schema`` plus ``i``.

    Label columns are ``groupby.<key>`` then ``metadata.<key>`` in first-seen order, null where a
    point lacks the key.  A non-string label value is matched by CloudKitty as ``str(value)`` but
    compared with thresholds as ``Decimal(value)``: the label column holds ``str(value)`` and, where
    ``Decimal`` sees something else (booleans, most floats), ``transforms.hashmap.decimal_column``
    holds the exact ``Decimal(value)``.
    """
    return usage_frame(_points(text, source))


def usage_frame(points: tuple[Point, ...]) -> pl.DataFrame:
    """The usage frame of validated points (``parse_usage`` describes its columns)."""
    columns: dict[str, list[Any]] = {
        SCOPE: [p.scope for p in points], TYPE: [p.type for p in points], BEGIN: [p.begin for p in points],
        END: [p.end for p in points], QTY: [p.qty for p in points], PRICE: [p.price for p in points],
        UNIT: [p.unit for p in points],
    }
    labels: dict[str, list[Any]] = {}
    for row, point in enumerate(points):
        for column_of, values in ((groupby_column, point.groupby), (metadata_column, point.metadata)):
            for key, (label, number) in values.items():
                _put(labels, column_of(key), row, label)
                if number is not None:
                    _put(labels, decimal_column(column_of(key)), row, number)
    for values in labels.values():
        values.extend([None] * (len(points) - len(values)))
    ordered = sorted(labels, key=lambda c: (c.startswith(DECIMAL_PREFIX), not c.startswith("groupby.")))
    schema = {SCOPE: pl.String, TYPE: pl.String, BEGIN: TIME_POLARS, END: TIME_POLARS, QTY: QTY_POLARS,
              PRICE: PRICE_POLARS, UNIT: pl.String} | {c: pl.String for c in ordered}
    data = columns | {c: labels[c] for c in ordered}
    return pl.DataFrame(data, schema=schema).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(INDEX))


def _put(columns: dict[str, list[Any]], column: str, row: int, value: str) -> None:
    values = columns.setdefault(column, [])
    values.extend([None] * (row - len(values)))
    values.append(value)

