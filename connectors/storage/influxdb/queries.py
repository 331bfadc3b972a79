r"""InfluxQL and Flux text for the InfluxDB backend, every user value escaped.

InfluxQL: identifiers are double-quoted with ``\`` and ``"`` escaped, string literals single-quoted
with ``\`` and ``'`` escaped, times are integer nanoseconds.  Flux: strings double-quoted with
``\``, ``"`` and ``${`` (interpolation) escaped; times RFC 3339.  Delete predicates of the v2 API
quote values like Flux strings.  ``custom_fields`` (InfluxQL select expressions, CloudKitty's
``total(custom_fields=...)``) are checked against a blacklist of statement words as CloudKitty does,
and, further than CloudKitty, against anything that could end the expression list (``;``, comments,
quotes, clauses).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from ratebeam.connectors.storage.base import Selection
from ratebeam.connectors.storage.influxdb.lineprotocol import MEASUREMENT, SCOPE_TAG
from ratebeam.transforms.schema import TYPE

#: Words CloudKitty refuses in custom_fields (storage/v2/influx.py), plus the clauses that would
#: change the query's shape.
CUSTOM_FIELDS_BLACKLIST = frozenset(
    {
        "select",
        "from",
        "where",
        "into",
        "drop",
        "delete",
        "create",
        "alter",
        "insert",
        "update",
        "grant",
        "revoke",
        "kill",
        "show",
        "group",
        "order",
        "limit",
        "offset",
        "slimit",
        "soffset",
        "fill",
        "tz",
        "on",
        "with",
        "database",
        "measurement",
        "series",
    }
)
_CUSTOM_FIELDS_CHARS = re.compile(r'^[A-Za-z0-9_\s(),.*+\-/"]+$')
_WORD = re.compile(r"[A-Za-z_]+")


def ident(name: str) -> str:
    r"""An InfluxQL identifier: ``"name"`` with ``\`` and ``"`` escaped."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(value: str) -> str:
    r"""An InfluxQL string literal: ``'value'`` with ``\``, ``'`` and newlines escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def flux_string(value: str) -> str:
    r"""A Flux string literal: ``"value"`` with ``\``, ``"`` and ``${`` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${") + '"'


def rfc3339(ns: int) -> str:
    """A nanosecond epoch as Flux/v2 API time: ``2024-01-01T00:00:00.000000001Z``."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{nanos:09d}Z" if nanos else f"{base}Z"


def _any_of(conditions: list[str], joiner: str) -> str:
    return conditions[0] if len(conditions) == 1 else "(" + f" {joiner} ".join(conditions) + ")"


def _scope_tests(scope: str, scope_key: str | None, test: Callable[[str, str], str]) -> list[str]:
    """The tests selecting ``scope``'s points: ratebeam's tag, and CloudKitty's ``scope_key`` tag.

    Every ratebeam point also carries ``scope_key`` = its scope (the collector groups by it), so
    the second test adds exactly the points CloudKitty wrote (``StorageBackend.scope_key``).
    """
    tags = [SCOPE_TAG] if scope_key is None or scope_key == SCOPE_TAG else [SCOPE_TAG, scope_key]
    return [test(tag, scope) for tag in tags]


def _influxql_test(tag: str, value: str) -> str:
    return f"{ident(tag)} = {literal(value)}"


def _flux_test(tag: str, value: str) -> str:
    return f"r[{flux_string(tag)}] == {flux_string(value)}"


def influxql_where(
    low_ns: int | None, high_ns: int | None, selection: Selection, labels: bool, empty_values: bool = False,
    scope_key: str | None = None,
) -> str:
    """A WHERE clause: ``low <= time < high``, types, scopes and (``labels``) label pre-filters.

    A scope is selected by ratebeam's tag or, when ``scope_key`` is given, CloudKitty's (see
    :func:`_scope_tests`).

    A label filter ``k in values`` matches the groupby tag or the metadata field ``k``.  Values
    ``''`` are not pushed down (``"k" = ''`` would also match points without the label): the caller
    applies the exact filter to what comes back, so pushing down only has to select a superset.
    """
    parts = []
    if low_ns is not None:
        parts.append(f"time >= {low_ns}")
    if high_ns is not None:
        parts.append(f"time < {high_ns}")
    if selection.types is not None:
        parts.append(_any_of([_influxql_test(TYPE, v) for v in sorted(selection.types)], "OR"))
    if selection.scopes is not None:
        tests = [t for v in sorted(selection.scopes) for t in _scope_tests(v, scope_key, _influxql_test)]
        parts.append(_any_of(tests, "OR"))
    if labels:
        for key, values in sorted(selection.labels.items()):
            if not values or ("" in values and not empty_values):
                continue
            tests = [
                f"{ident(key)}::{kind} = {literal(v)}" for v in sorted(values) for kind in ("tag", "field")
            ]
            parts.append(_any_of(tests, "OR"))
    return " WHERE " + " AND ".join(parts) if parts else ""


def slice_delete(scope: str, type_: str, first_ns: int, last_ns: int, scope_key: str | None = None) -> str:
    """InfluxQL removing every point of the (scope, type) slices that begin in ``[first, last]``."""
    return (
        f"DELETE FROM {ident(MEASUREMENT)} WHERE {_any_of(_scope_tests(scope, scope_key, _influxql_test), 'OR')}"
        f" AND {_influxql_test(TYPE, type_)} AND time >= {first_ns} AND time <= {last_ns}"
    )


def flux_select(
    bucket: str, low_ns: int, high_ns: int, selection: Selection, fields: tuple[str, ...] = (),
    scope_key: str | None = None,
) -> str:
    """Flux reading every field row of matching points (types, scopes and ``fields`` pushed down).

    Rows are not pivoted: a tag and a field may share a name (a groupby and a metadata label), which
    a pivot would collide; the client pivots with prefixed names instead.
    """
    tests = [f"r._measurement == {flux_string(MEASUREMENT)}"]
    if selection.types is not None:
        tests.append(_any_of([_flux_test(TYPE, v) for v in sorted(selection.types)], "or"))
    if selection.scopes is not None:
        tests.append(_any_of([t for v in sorted(selection.scopes) for t in _scope_tests(v, scope_key, _flux_test)],
                             "or"))
    if fields:
        tests.append(_any_of([f"r._field == {flux_string(f)}" for f in fields], "or"))
    return (
        f"from(bucket: {flux_string(bucket)})\n"
        f"  |> range(start: {rfc3339(low_ns)}, stop: {rfc3339(high_ns)})\n"
        f"  |> filter(fn: (r) => {' and '.join(tests)})\n"
        '  |> drop(columns: ["_start", "_stop", "_measurement"])'
    )


def delete_predicate(tags: dict[str, str]) -> str:
    """A v2 delete-API predicate: ``_measurement="dataframes" AND k="v" ...`` (values escaped)."""
    terms = [f"_measurement={flux_string(MEASUREMENT)}"]
    terms += [f"{key}={flux_string(value)}" for key, value in tags.items()]
    return " AND ".join(terms)


def check_custom_fields(custom_fields: str) -> str:
    """``custom_fields`` as given, or ``ValueError`` naming the refused word or character."""
    text = custom_fields.strip()
    if not text:
        raise ValueError("influxdb storage: custom_fields is empty")
    if not _CUSTOM_FIELDS_CHARS.match(text) or "--" in text or "/*" in text:
        raise ValueError(
            f"influxdb storage: custom_fields {custom_fields!r}: only field expressions are allowed "
            "(letters, digits, _ ( ) , . * + - / and double-quoted identifiers; no ';', quotes or comments)"
        )
    words = {w.lower() for w in _WORD.findall(re.sub(r'"(?:[^"\\]|\\.)*"', " ", text))}
    refused = sorted(words & CUSTOM_FIELDS_BLACKLIST)
    if refused:
        raise ValueError(
            f"influxdb storage: custom_fields {custom_fields!r}: clause(s) {', '.join(refused)} not allowed"
        )
    return text


_FLUX_CUSTOM_FIELD = re.compile(r"^\s*(sum|mean|count|min|max)\(\s*(qty|price)\s*\)\s+as\s+(\w+)\s*$", re.I)


def flux_custom_fields(custom_fields: str) -> list[tuple[str, str, str]]:
    """v2 ``custom_fields``: CloudKitty's ``FUNC(field) AS alias`` items as (function, field, alias).

    Functions sum, mean, count, min, max over ``qty`` or ``price``; anything else is ``ValueError``.
    """
    check_custom_fields(custom_fields)
    items = []
    for item in custom_fields.split(","):
        match = _FLUX_CUSTOM_FIELD.match(item)
        if match is None:
            raise ValueError(
                f"influxdb storage (v2): custom_fields item {item.strip()!r} is not "
                "FUNC(qty|price) AS alias with FUNC one of sum, mean, count, min, max"
            )
        items.append((match.group(1).lower(), match.group(2).lower(), match.group(3)))
    return items
