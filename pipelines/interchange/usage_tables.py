"""Usage for ``ratebeam rate`` in other shapes than JSONL: CSV, Parquet, ``report dataframes`` JSON.

Every shape becomes the points of a usage JSONL file and goes through the same ``Point`` model, so
a mistake is reported the same way, where the user finds it: ``usage.csv: line 3.qty: not a
decimal: 'x'``, ``usage.parquet: row 2.begin: ...``, ``rated.json: dataframes[0].usage.instance[1].qty: ...``.

* CSV and Parquet: one point a row; the columns of a usage point (interchange.md) — ``type``,
  ``qty``, ``begin``, ``end``, optional ``unit``, ``price``, ``scope`` (or ``scope_id``, as rated
  data names it) — and labels: ``groupby.KEY`` and ``metadata.KEY`` columns, and any other column
  as a groupby label, like the label columns of the file collector (``project_id``, ``flavor_name``).
  An empty CSV cell is an absent label (CSV cannot tell an empty text from none; a null in
  Parquet is absent, ``""`` there is an empty label, as in JSONL).  The file collector's *samples* (``metric``, ``timestamp``,
  ``value``) are not usage: they are refused with a word on how to rate them.
* ``report dataframes --format json`` (CloudKitty's ``/v2/dataframes`` shape): each point's
  period, ``vol.qty`` and ``vol.unit``, groupby and metadata; the scope is the groupby label
  ``scope_key`` (in CSV and Parquet too, when no scope column says otherwise).  Its ``rating.price`` is the price it was given, so it is not added to: the
  points are priced afresh.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange.document import Document, json_list, load_json, read_text
from ratebeam.pipelines.interchange.usage import parse_usage, usage_frame, validate_points
from ratebeam.pipelines.validation import validate

FORMATS = ("auto", "jsonl", "csv", "parquet", "dataframes")
_POINT_KEYS = {"type", "qty", "begin", "end", "unit", "price", "scope"}
_SAMPLE_COLUMNS = {"metric", "timestamp", "value"}


def read_usage_file(path: str | Path, fmt: str = "auto", scope_key: str = "project_id") -> pl.DataFrame:
    """The usage frame of a JSONL, CSV, Parquet or dataframes-JSON file (``auto``: by suffix, then content)."""
    source = str(path)
    if fmt == "auto":
        fmt = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(Path(path).suffix.lower(), "json")
    if fmt == "parquet":
        return usage_frame(validate_points(_parquet_rows(path, scope_key), source))
    text = read_text(path)
    if fmt == "csv":
        return usage_frame(validate_points(_csv_rows(text, source, scope_key), source))
    if fmt in ("json", "dataframes"):
        document = _dataframes_document(text, source) if fmt == "json" else load_json(text, source, exact_numbers=False)
        if document is not None:
            return usage_frame(validate_points(_dataframes_points(document, source, scope_key), source))
    return parse_usage(text, source)


def _point(values: dict[str, Any], scope_key: str) -> dict[str, Any]:
    """A usage point from one row's cells but the absent ones (module doc for the columns)."""
    point: dict[str, Any] = {"groupby": {}, "metadata": {}}
    for column, value in values.items():
        if value is None:
            continue
        if isinstance(value, datetime):
            value = value.isoformat()  # Instant takes ISO-8601 text; a naive one is UTC
        section, _, key = column.partition(".")
        if key and section in ("groupby", "metadata"):
            point[section][key] = value
        elif column in _POINT_KEYS or column == "scope_id":
            point["scope" if column == "scope_id" else column] = value
        else:
            point["groupby"][column] = value
    if "scope" not in point and point["groupby"].get(scope_key) is not None:
        point["scope"] = point["groupby"][scope_key]
    return point


def _check_columns(columns: list[str], source: str) -> None:
    if set(columns) >= _SAMPLE_COLUMNS and "type" not in columns:
        raise InputError(source, "columns", "these are collector samples (metric, timestamp, value), not usage "
                         "points: rate them with `ratebeam run` and the file collector, or give the columns of a "
                         "usage point (type, qty, begin, end)", ", ".join(columns))
    for name in ("type", "qty", "begin", "end"):
        if name not in columns:
            raise InputError(source, "columns", f"missing the column {name!r} (a usage point has type, qty, "
                             "begin, end)", ", ".join(columns))


def _csv_rows(text: str, source: str, scope_key: str) -> dict[str, Any]:
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    try:
        _check_columns(list(reader.fieldnames or ()), source)
        rows = {}
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row:  # DictReader keeps the cells beyond the header under None
                raise InputError(source, where, f"more cells than the {len(reader.fieldnames or ())} columns")
            rows[where] = _point({k: v for k, v in row.items() if v != ""}, scope_key)  # empty cell: absent
    except csv.Error as err:
        raise InputError(source, f"line {reader.line_num}", f"invalid CSV: {err}") from None
    return rows


def _parquet_rows(path: str | Path, scope_key: str) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = str(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise InputError(source, "", f"cannot read as Parquet: {err}") from None
    _check_columns(table.column_names, source)
    return {f"row {n}": _point(row, scope_key) for n, row in enumerate(table.to_pylist(), start=1)}


class _Volume(Document):
    qty: Any
    unit: Any = None


class _RatedPoint(Document):
    vol: _Volume
    rating: Any = None
    groupby: Any = None
    metadata: Any = None


class _Period(Document):
    begin: Any
    end: Any


class _DataFrame(Document):
    period: _Period
    usage: dict[str, json_list(_RatedPoint)]


class _DataFrames(Document):
    dataframes: json_list(_DataFrame)
    total: Any = None


def _dataframes_document(text: str, source: str) -> Any:
    """The parsed document when ``text`` is one JSON object with ``dataframes``, else None (JSONL)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        document = load_json(text, source, exact_numbers=False)
    except InputError:
        return None  # not one JSON document: JSONL, whose reader reports its own errors
    return document if isinstance(document, dict) and "dataframes" in document else None


def _dataframes_points(document: Any, source: str, scope_key: str) -> dict[str, Any]:
    frames = validate(_DataFrames, document, source).dataframes
    points: dict[str, Any] = {}
    for f, frame in enumerate(frames):
        for type_, rated in frame.usage.items():
            for p, point in enumerate(rated):
                groupby = point.groupby if isinstance(point.groupby, dict) else {}
                raw = {"type": type_, "qty": point.vol.qty, "unit": point.vol.unit, "begin": frame.period.begin,
                       "end": frame.period.end, "groupby": point.groupby, "metadata": point.metadata}
                if groupby.get(scope_key) is not None:
                    raw["scope"] = groupby[scope_key]
                points[f"dataframes[{f}].usage.{type_}[{p}]"] = {k: v for k, v in raw.items() if v is not None}
    return points
