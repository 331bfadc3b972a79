"""The interchange files (``/work/shared/spec/interchange.md``): rules JSON, usage JSONL, rated JSONL.

They let a user price usage without any server (``ratebeam rate``), move rules between databases,
and let tests feed ratebeam and CloudKitty the same input.  Reading validates like CloudKitty's API
and database do (spec §4.1) and reports a refused file as one ``InputError`` naming the file, the
JSON path and the value, e.g. ``rules.json: services[0].fields[1].mappings[2].cost: not a decimal:
'abc'``.  Writing rules back is exact: reading what ``write_rules`` wrote gives an equal ``RuleSet``.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from ratebeam.pipelines.errors import InputError
from ratebeam.transforms.hashmap import DECIMAL_PREFIX, RatingOutcome, decimal_column
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule
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
#: Default mapping ``start`` of the rules format: a rule in a file applies to all history.

_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_TOP_KEYS = frozenset({"groups", "services"})
_SERVICE_KEYS = frozenset({"name", "mappings", "thresholds", "fields"})
_FIELD_KEYS = frozenset({"name", "mappings", "thresholds"})
_MAPPING_KEYS = frozenset({"value", "type", "cost", "group", "tenant_id", "start", "end"})
_THRESHOLD_KEYS = frozenset({"level", "type", "cost", "group", "tenant_id"})
_POINT_KEYS = frozenset({"type", "qty", "unit", "price", "scope", "begin", "end", "groupby", "metadata"})
# CloudKitty's columns: cost NUMERIC(40,28), level NUMERIC(20,8) (spec §1.3).
_COST_DIGITS = (12, 28)
_LEVEL_DIGITS = (12, 8)
_WIDE = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_EVEN)


# ---------------------------------------------------------------------------------------- helpers


class _Doc:
    """A parsed JSON document and the file it came from, for error messages."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str, *value: object) -> InputError:
        return InputError(self.source, where, message, *value)

    def load(self, text: str, *, exact_numbers: bool) -> Any:
        try:
            return json.loads(text, parse_float=Decimal if exact_numbers else float,
                              parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise self.fail(f"line {err.lineno} column {err.colno}", f"invalid JSON: {err.msg}") from None
        except _JsonValueError as err:
            raise self.fail("", f"invalid JSON: {err}") from None

    def obj(self, value: Any, where: str, keys: frozenset[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, not {_json_type(value)}")
        for key in value:
            if key not in keys:
                raise self.fail(_join(where, key), f"unknown key (expected one of {', '.join(sorted(keys))})")
        return value

    def array(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list, not {_json_type(value)}")
        return value

    def text(self, value: Any, where: str, *, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(where, "must be a non-empty string", value)
        return value

    def decimal(self, value: Any, where: str, digits: tuple[int, int] | None = None) -> Decimal:
        if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
            raise self.fail(where, f"must be a decimal string or a number, not {_json_type(value)}")
        if isinstance(value, str):
            if not _DECIMAL_TEXT.fullmatch(value):
                raise self.fail(where, "not a decimal", value)
            number = Decimal(value)
        elif isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise self.fail(where, "not a finite number", value)
            number = Decimal(str(value))
        else:
            number = Decimal(value)
        if digits is not None:
            integers, decimals = digits
            if number.copy_abs() >= Decimal(10) ** integers or _decimals(number) > decimals:
                raise self.fail(where, f"out of CloudKitty's NUMERIC({integers + decimals},{decimals}) range",
                                str(value))
        return number

    def time(self, value: Any, where: str) -> datetime:
        if not isinstance(value, str):
            raise self.fail(where, f"must be an ISO-8601 datetime string, not {_json_type(value)}")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise self.fail(where, "not an ISO-8601 datetime", value) from None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)

    def map_type(self, value: Any, where: str) -> str:
        if value not in ("flat", "rate"):
            raise self.fail(where, "must be 'flat' or 'rate'", value)
        return value


class _JsonValueError(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _JsonValueError(f"{name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _decimals(number: Decimal) -> int:
    """Digits after the point once trailing zeros are dropped, for any exponent (no context)."""
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: checked by the caller
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return 0 if trailing == len(digits) else max(0, -(exponent + trailing))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return "a number"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(str(path), "", f"cannot read: {getattr(err, 'strerror', None) or err}") from None


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def plain_decimal(value: Decimal) -> str:
    """A decimal as plain text without exponent or trailing zeros (``Decimal('10.20')`` -> ``10.2``)."""
    if not value:
        return "0"
    return format(value.normalize(_WIDE), "f")


# ------------------------------------------------------------------------------------------ rules


def read_rules(path: str | Path) -> RuleSet:
    """Read and validate a rules JSON file (interchange.md); ``InputError`` names what is wrong."""
    return parse_rules(_read_text(path), str(path))


def parse_rules(text: str, source: str) -> RuleSet:
    """Parse rules JSON text; ``source`` names the file in errors."""
    doc = _Doc(source)
    top = doc.obj(doc.load(text, exact_numbers=True), "", _TOP_KEYS)
    groups = []
    for i, name in enumerate(doc.array(top.get("groups"), "groups")):
        name = doc.text(name, f"groups[{i}]")
        if name in groups:
            raise doc.fail(f"groups[{i}]", "duplicate group", name)
        groups.append(name)
    services: list[str] = []
    fields: list[tuple[str, str]] = []
    mappings: list[tuple[str, MappingRule]] = []
    thresholds: list[tuple[str, ThresholdRule]] = []
    for i, raw_service in enumerate(doc.array(top.get("services"), "services")):
        where = f"services[{i}]"
        service = doc.obj(raw_service, where, _SERVICE_KEYS)
        name = doc.text(service.get("name"), _join(where, "name"))
        if name in services:
            raise doc.fail(_join(where, "name"), "duplicate service", name)
        services.append(name)
        mappings += _mappings(doc, service, where, name, None)
        thresholds += _thresholds(doc, service, where, name, None)
        for j, raw_field in enumerate(doc.array(service.get("fields"), _join(where, "fields"))):
            field_where = f"{where}.fields[{j}]"
            field = doc.obj(raw_field, field_where, _FIELD_KEYS)
            field_name = doc.text(field.get("name"), _join(field_where, "name"))
            if (name, field_name) in fields:
                raise doc.fail(_join(field_where, "name"), "duplicate field of this service", field_name)
            fields.append((name, field_name))
            mappings += _mappings(doc, field, field_where, name, field_name)
            thresholds += _thresholds(doc, field, field_where, name, field_name)
    _check_overlaps(doc, mappings)
    _check_levels(doc, thresholds)
    used = [r.group for _, r in (*mappings, *thresholds) if r.group is not None]
    return RuleSet(
        services=tuple(services),
        fields=tuple(fields),
        mappings=tuple(r for _, r in mappings),
        thresholds=tuple(r for _, r in thresholds),
        groups=tuple(dict.fromkeys([*groups, *used])),
    )


def _mappings(doc: _Doc, parent: dict[str, Any], where: str, service: str,
              field: str | None) -> Iterator[tuple[str, MappingRule]]:
    for k, raw in enumerate(doc.array(parent.get("mappings"), _join(where, "mappings"))):
        at = f"{where}.mappings[{k}]"
        rule = doc.obj(raw, at, _MAPPING_KEYS)
        if field is None:
            if rule.get("value") is not None:
                raise doc.fail(_join(at, "value"), "a service mapping has no value", rule["value"])
            value = None
        else:
            if rule.get("value") is None or rule.get("value") == "":
                raise doc.fail(_join(at, "value"), "a field mapping needs a non-empty value")
            value = doc.text(rule["value"], _join(at, "value"))
        if "cost" not in rule:
            raise doc.fail(_join(at, "cost"), "missing")
        start = doc.time(rule["start"], _join(at, "start")) if rule.get("start") is not None else None
        end = doc.time(rule["end"], _join(at, "end")) if rule.get("end") is not None else None
        if end is not None and start is not None and end <= start:
            raise doc.fail(_join(at, "end"), "must be after start", rule["end"])
        yield at, MappingRule(
            service=service,
            field=field,
            value=value,
            type=doc.map_type(rule.get("type", "flat"), _join(at, "type")),
            cost=doc.decimal(rule["cost"], _join(at, "cost"), _COST_DIGITS),
            group=doc.text(rule.get("group"), _join(at, "group"), optional=True),
            tenant_id=doc.text(rule.get("tenant_id"), _join(at, "tenant_id"), optional=True),
            start=start,
            end=end,
        )


def _thresholds(doc: _Doc, parent: dict[str, Any], where: str, service: str,
                field: str | None) -> Iterator[tuple[str, ThresholdRule]]:
    for k, raw in enumerate(doc.array(parent.get("thresholds"), _join(where, "thresholds"))):
        at = f"{where}.thresholds[{k}]"
        rule = doc.obj(raw, at, _THRESHOLD_KEYS)
        if "cost" not in rule:
            raise doc.fail(_join(at, "cost"), "missing")
        yield at, ThresholdRule(
            service=service,
            field=field,
            level=doc.decimal(rule.get("level", 0), _join(at, "level"), _LEVEL_DIGITS),
            type=doc.map_type(rule.get("type", "flat"), _join(at, "type")),
            cost=doc.decimal(rule["cost"], _join(at, "cost"), _COST_DIGITS),
            group=doc.text(rule.get("group"), _join(at, "group"), optional=True),
            tenant_id=doc.text(rule.get("tenant_id"), _join(at, "tenant_id"), optional=True),
        )


def _check_overlaps(doc: _Doc, mappings: list[tuple[str, MappingRule]]) -> None:
    """Spec §4.1: one mapping per parent + value + tenant + group at any time."""
    seen: dict[tuple, list[tuple[str, MappingRule]]] = {}
    for at, rule in mappings:
        key = (rule.service, rule.field, rule.value, rule.tenant_id, rule.group)
        for other_at, other in seen.get(key, []):
            if _before(other.start, rule.end) and _before(rule.start, other.end):
                raise doc.fail(at, f"overlaps the validity of {other_at} (same parent, value, tenant and "
                                   "group)")
        seen.setdefault(key, []).append((at, rule))


def _before(start: datetime | None, end: datetime | None) -> bool:
    return start is None or end is None or start < end


def _check_levels(doc: _Doc, thresholds: list[tuple[str, ThresholdRule]]) -> None:
    """Spec §4.1: one threshold level per parent and tenant, whatever the group."""
    seen: dict[tuple, str] = {}
    for at, rule in thresholds:
        key = (rule.service, rule.field, rule.tenant_id, rule.level)
        if key in seen:
            raise doc.fail(_join(at, "level"), f"same level as {seen[key]} (same parent and tenant)",
                           str(rule.level))
        seen[key] = at


def rules_to_json(rules: RuleSet) -> dict[str, Any]:
    """The rules JSON document of a rule set (every key written, decimals as exact strings).

    Rules are nested per service, in ``rules.services`` order, keeping their order within a service
    (the only order that matters: fields of one service break threshold ties in ``rules.fields``
    order); a rule set read from a file comes back identical.
    """
    def mapping(rule: MappingRule) -> dict[str, Any]:
        out: dict[str, Any] = {} if rule.field is None else {"value": rule.value}
        return out | {
            "type": rule.type, "cost": str(rule.cost), "group": rule.group, "tenant_id": rule.tenant_id,
            "start": None if rule.start is None else _iso(rule.start),
            "end": None if rule.end is None else _iso(rule.end),
        }

    def threshold(rule: ThresholdRule) -> dict[str, Any]:
        return {"level": str(rule.level), "type": rule.type, "cost": str(rule.cost), "group": rule.group,
                "tenant_id": rule.tenant_id}

    known = {(s, None) for s in rules.services} | set(rules.fields)
    for rule in (*rules.mappings, *rules.thresholds):
        if (rule.service, rule.field) not in known:
            raise ValueError(f"rule on undeclared service/field {rule.service!r}/{rule.field!r}: {rule}")
    services = []
    for name in rules.services:
        service: dict[str, Any] = {"name": name}
        service["mappings"] = [mapping(m) for m in rules.mappings if m.service == name and m.field is None]
        service["thresholds"] = [threshold(t) for t in rules.thresholds if t.service == name and t.field is None]
        service["fields"] = [
            {"name": field,
             "mappings": [mapping(m) for m in rules.mappings if m.service == name and m.field == field],
             "thresholds": [threshold(t) for t in rules.thresholds if t.service == name and t.field == field]}
            for svc, field in rules.fields if svc == name
        ]
        services.append(service)
    return {"groups": list(rules.groups), "services": services}


def write_rules(rules: RuleSet, out: TextIO) -> None:
    """Write a rule set as rules JSON (``ratebeam rules export``)."""
    json.dump(rules_to_json(rules), out, indent=2)
    out.write("\n")


# ------------------------------------------------------------------------------------------ usage


def read_usage(path: str | Path) -> pl.DataFrame:
    """Read usage JSONL (or a JSON list, or ``{"points": [...]}``) into a usage frame."""
    return parse_usage(_read_text(path), str(path))


def parse_usage(text: str, source: str) -> pl.DataFrame:
    """Parse usage text into a frame with the columns of ``transforms.schema`` plus ``i``.

    Label columns are ``groupby.<key>`` then ``metadata.<key>`` in first-seen order, null where a
    point lacks the key.  A non-string label value is matched by CloudKitty as ``str(value)`` but
    compared with thresholds as ``Decimal(value)``: the label column holds ``str(value)`` and, where
    ``Decimal`` sees something else (booleans, most floats), ``transforms.hashmap.decimal_column``
    holds the exact ``Decimal(value)``.  ``scope_id`` defaults to ``groupby.project_id`` when the
    point's ``scope`` is absent or null.
    """
    doc = _Doc(source)
    columns: dict[str, list[Any]] = {c: [] for c in (SCOPE, TYPE, BEGIN, END, QTY, PRICE, UNIT)}
    labels: dict[str, list[Any]] = {}
    count = 0
    for row, (where, raw) in enumerate(_points(doc, text)):
        point = doc.obj(raw, where, _POINT_KEYS)
        for key in ("type", "qty", "begin", "end"):
            if key not in point:
                raise doc.fail(_join(where, key), "missing")
        groupby = _label_map(doc, point.get("groupby"), _join(where, "groupby"))
        metadata = _label_map(doc, point.get("metadata"), _join(where, "metadata"))
        scope = point.get("scope")
        if scope is None:
            scope = groupby["project_id"][0] if "project_id" in groupby else None
        unit = point.get("unit")
        if unit is not None and not isinstance(unit, str):
            raise doc.fail(_join(where, "unit"), f"must be a string, not {_json_type(unit)}")
        columns[SCOPE].append(doc.text(scope, _join(where, "scope"), optional=True))
        columns[TYPE].append(doc.text(point["type"], _join(where, "type")))
        columns[BEGIN].append(doc.time(point["begin"], _join(where, "begin")))
        columns[END].append(doc.time(point["end"], _join(where, "end")))
        columns[QTY].append(_scaled(doc, point["qty"], _join(where, "qty"), QTY_SCALE))
        columns[PRICE].append(_scaled(doc, point.get("price", 0), _join(where, "price"), PRICE_SCALE))
        columns[UNIT].append(unit or "undefined")
        for column_of, values in ((groupby_column, groupby), (metadata_column, metadata)):
            for key, (label, number) in values.items():
                _put(labels, column_of(key), row, label)
                if number is not None:
                    _put(labels, decimal_column(column_of(key)), row, number)
        count = row + 1
    for values in labels.values():
        values.extend([None] * (count - len(values)))
    ordered = sorted(labels, key=lambda c: (c.startswith(DECIMAL_PREFIX), not c.startswith("groupby.")))
    schema = {SCOPE: pl.String, TYPE: pl.String, BEGIN: TIME_POLARS, END: TIME_POLARS, QTY: QTY_POLARS,
              PRICE: PRICE_POLARS, UNIT: pl.String} | {c: pl.String for c in ordered}
    data = columns | {c: labels[c] for c in ordered}
    return pl.DataFrame(data, schema=schema).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(INDEX))


def _put(columns: dict[str, list[Any]], column: str, row: int, value: str) -> None:
    values = columns.setdefault(column, [])
    values.extend([None] * (row - len(values)))
    values.append(value)


def _points(doc: _Doc, text: str) -> Iterator[tuple[str, Any]]:
    """(location, point) pairs of a JSON list, a ``{"points": [...]}`` object or JSONL text."""
    head = text.lstrip()[:1]
    if head == "[":
        whole = doc.load(text, exact_numbers=False)
        yield from ((f"[{i}]", point) for i, point in enumerate(doc.array(whole, "")))
        return
    if head == "{":
        try:
            whole = doc.load(text, exact_numbers=False)
        except InputError:
            whole = None  # not one JSON document: JSONL
        if isinstance(whole, dict) and "points" in whole:
            points = doc.obj(whole, "", frozenset({"points"}))["points"]
            yield from ((f"points[{i}]", point) for i, point in enumerate(doc.array(points, "points")))
            return
        if whole is not None:  # one point, on one line or several
            first_line = text[:len(text) - len(text.lstrip())].count("\n") + 1
            yield f"line {first_line}", whole
            return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield f"line {number}", doc.load(line, exact_numbers=False)
            except InputError as err:
                raise doc.fail(f"line {number}", err.message) from None


def _label_map(doc: _Doc, value: Any, where: str) -> dict[str, tuple[str, str | None]]:
    """key -> (``str(value)``, the text of ``Decimal(value)`` when it differs from it, else None)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise doc.fail(where, f"must be an object, not {_json_type(value)}")
    return {key: (item, None) if isinstance(item, str) else _typed_label(item) for key, item in value.items()}


def _typed_label(value: Any) -> tuple[str, str | None]:
    text = str(value)
    try:
        number = str(Decimal(value))
    except (TypeError, ValueError, decimal.InvalidOperation):
        return text, None  # Decimal() raises in CloudKitty too, and so does Decimal(text)
    return text, None if number == text else number


def _scaled(doc: _Doc, value: Any, where: str, scale: int) -> Decimal:
    """A qty or price at the batch scale (rounded half-even), refused when it does not fit."""
    number = doc.decimal(value, where)
    limit = Decimal(10) ** (38 - scale)
    scaled = number.quantize(Decimal(1).scaleb(-scale), context=_WIDE) if number.copy_abs() < limit else limit
    if abs(scaled) >= limit:
        raise doc.fail(where, f"does not fit decimal(38, {scale})", value)
    return scaled


# ------------------------------------------------------------------------------------------ rated


@dataclass(frozen=True)
class RatedSummary:
    """The summary line of a rated JSONL file."""

    count: int
    frames: int
    errors: int
    total: Decimal


def write_rated(usage: pl.DataFrame, outcome: RatingOutcome, out: TextIO) -> RatedSummary:
    """Write one rated line per usage point in input order, then the summary line (interchange.md).

    A point of a failed frame gets ``"price": null`` and the frame's ``"error"``.
    """
    reasons = {(f.scope_id, f.begin, f.end): f.reason for f in outcome.failures}
    prices = dict(zip(outcome.rated.get_column(INDEX).to_list(), outcome.rated.get_column(PRICE).to_list(),
                      strict=True))
    frames: set[tuple] = set()
    failed: set[tuple] = set()
    total = Decimal(0)
    rows = usage.select(INDEX, TYPE, SCOPE, BEGIN, END, QTY).iter_rows()
    for index, type_, scope, begin, end, qty in rows:
        frames.add((scope, begin, end))
        line: dict[str, Any] = {"i": index, "type": type_, "scope": scope, "begin": begin.isoformat(),
                                "end": end.isoformat(), "qty": plain_decimal(qty)}
        price = prices.get(index)
        if price is None:
            failed.add((scope, begin, end))
            line["price"] = None
            line["error"] = reasons.get((scope, begin, end), "not rated")
        else:
            total = _WIDE.add(total, price)
            line["price"] = plain_decimal(price)
        out.write(json.dumps(line) + "\n")
    summary = RatedSummary(count=usage.height, frames=len(frames), errors=len(failed), total=total)
    out.write(json.dumps({"summary": {"count": summary.count, "frames": summary.frames,
                                      "errors": summary.errors, "total": plain_decimal(summary.total)}}) + "\n")
    return summary
