"""Loads ``metrics.yml`` with CloudKitty's schema and semantics into a typed ``MetricsConfig``.

CloudKitty's format is read as is (spec §2): ``{metrics: {name: definition | [definitions]}}``,
the base schema of ``collector/__init__.py:81-119``, ``check_configuration``'s ``name@#alt_name``
keys with the scope key appended to ``groupby`` (§2.3), each collector's ``extra_args`` with its
defaults (§2.4), and the checks CloudKitty only does in ``validate_conf`` (a key in both groupby
and metadata; ``MAP`` <-> ``mutate_map``).  Stricter than CloudKitty, each with a clear message:
two definitions with the same rating type (CloudKitty silently keeps one), duplicate YAML keys
(PyYAML silently keeps the last), ``mutate_map`` keys that are not numbers (CloudKitty never
matches them), a label listed twice, a ``skip_datapoints_expression`` outside the safe language
of ``transforms.skip_expression`` or reading a label the metric does not collect, booleans and
non-finite numbers where numbers are expected.

Every error is one ``InputError`` naming the file, the key path and the value.  ``Where`` and
``read_yaml`` are shared with ``pipelines.config``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, dataclass, fields
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from ratebeam.connectors.collectors.prometheus.promql import LABEL_NAME, METRIC_NAME
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.yaml_loader import read_yaml
from ratebeam.transforms.metric_defs import (
    FILE_AGGREGATIONS,
    GNOCCHI_AGGREGATIONS,
    GNOCCHI_RE_AGGREGATIONS,
    KEY_SEPARATOR,
    PROMETHEUS_AGGREGATIONS,
    PROMETHEUS_QUERY_FUNCTIONS,
    PROMETHEUS_RANGE_FUNCTIONS,
    ExtraArgs,
    FileExtraArgs,
    FrozenMap,
    GnocchiExtraArgs,
    MetricDef,
    MetricsConfig,
    Mutate,
    PrometheusExtraArgs,
)
from ratebeam.transforms.schema import TIME_KEYS
from ratebeam.transforms.skip_expression import SkipExpressionError, parse_skip

# ---- YAML reading and located validation (shared with pipelines.config) ----


@dataclass(frozen=True)
class Where:
    """A position in a YAML document (file + key path) that validates values and builds errors."""

    source: str
    path: str = ""

    def key(self, name: object) -> Where:
        """The position of ``name`` inside this mapping."""
        return Where(self.source, f"{self.path}.{name}" if self.path else str(name))

    def index(self, i: int) -> Where:
        """The position of item ``i`` inside this list."""
        return Where(self.source, f"{self.path}[{i}]")

    def error(self, message: str, *value: object) -> InputError:
        """The error to raise here; ``value`` (at most one) is shown with ``repr``."""
        return InputError(self.source, self.path or "(top level)", message, *value)

    def mapping(self, value: object, required: Collection[str] = (), optional: Collection[str] = ()) -> dict[str, Any]:
        """``value`` as a mapping with exactly these keys allowed; unknown keys are refused."""
        if not isinstance(value, dict):
            raise self.error("expected a mapping", value)
        allowed = set(required) | set(optional)
        for name in value:
            if not isinstance(name, str):
                raise self.error("keys must be strings", name)
            if name not in allowed:
                raise self.key(name).error(f"unknown key (expected one of: {', '.join(sorted(allowed))})")
        for name in required:
            if name not in value:
                raise self.key(name).error("required key is missing")
        return value

    def string(self, value: object, allow_empty: bool = False) -> str:
        """``value`` if it is a string (non-empty unless ``allow_empty``)."""
        if not isinstance(value, str) or (not allow_empty and not value):
            raise self.error("expected a string" if allow_empty else "expected a non-empty string", value)
        return value

    def integer(self, value: object, minimum: int) -> int:
        """``value`` if it is an integer >= ``minimum`` (YAML booleans are not integers here)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(f"expected an integer >= {minimum}", value)
        return value

    def boolean(self, value: object) -> bool:
        """``value`` if it is a YAML boolean."""
        if not isinstance(value, bool):
            raise self.error("expected true or false", value)
        return value

    def choice(self, value: object, choices: Collection[str], expected: str | None = None) -> str:
        """``value`` if it is one of ``choices``; ``expected`` describes them in the error."""
        if not isinstance(value, str) or value not in choices:
            raise self.error(f"expected one of {expected or ', '.join(sorted(choices))}", value)
        return value

    def string_list(self, value: object, allow_empty: bool = True) -> tuple[str, ...]:
        """A list of unique non-empty strings."""
        if not isinstance(value, list) or (not allow_empty and not value):
            raise self.error("expected a list of strings" if allow_empty else "expected a non-empty list of strings", value)
        items = tuple(self.index(i).string(item) for i, item in enumerate(value))
        for i, item in enumerate(items):
            if item in items[:i]:
                raise self.index(i).error("listed twice", item)
        return items


# ---- numbers, as CloudKitty's num2decimal sees them (spec §1.3) ----


def _factor(where: Where, value: object) -> Decimal:
    """``Any(int, float, Coerce(Fraction))`` then ``num2decimal``: exact int, float's binary expansion."""
    if isinstance(value, bool):
        raise where.error("not a number or fraction", value)
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise where.error("not a finite number", value)
        return Decimal(value)
    if isinstance(value, str):
        try:
            fraction = Fraction(value)
        except (ValueError, ZeroDivisionError):
            raise where.error("not a number or fraction", value) from None
        try:
            return Decimal(float(fraction))
        except OverflowError:
            raise where.error("number too large", value) from None
    raise where.error("not a number or fraction", value)


def _map_key(where: Where, key: object) -> Decimal:
    """A ``mutate_map`` key: CloudKitty looks ``Decimal`` qty up in the dict, so it matches exactly
    the number whose value equals the YAML int or float (``Decimal(float)``, the binary expansion)."""
    if isinstance(key, bool) or not isinstance(key, int | float):
        raise where.error(
            "mutate_map keys must be numbers (CloudKitty looks the quantity up as a Decimal, "
            "so a key of another type never matches)",
            key,
        )
    if isinstance(key, float) and (key != key or key in (float("inf"), float("-inf"))):
        raise where.error("not a finite number", key)
    return Decimal(key)


def _map_value(where: Where, value: object) -> Decimal:
    """A ``mutate_map`` value as CloudKitty's DataPoint makes it a qty: a float via ``str()``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise where.error("expected a number", value)
    try:
        number = Decimal(str(value) if isinstance(value, float) else value)
    except ArithmeticError:
        raise where.error("expected a number", value) from None
    if not number.is_finite():
        raise where.error("not a finite number", value)
    return number


# ---- collector extra_args (spec §2.4) ----

_Validator = Callable[[Where, object], Any]


def _one_of(choices: Collection[str], expected: str | None = None) -> _Validator:
    return lambda where, value: where.choice(value, choices, expected)


def _text(allow_empty: bool) -> _Validator:
    return lambda where, value: where.string(value, allow_empty)


@dataclass(frozen=True)
class _ExtraArgsSpec:
    """How one collector validates ``extra_args``: its dataclass and one validator per field."""

    cls: type
    validators: Mapping[str, _Validator]
    section_required: bool = False
    #: The backend's grammar for metric and label names (PromQL cannot quote them), if it has one.
    name_patterns: tuple[re.Pattern[str], re.Pattern[str]] | None = None


EXTRA_ARGS: dict[str, _ExtraArgsSpec] = {
    "prometheus": _ExtraArgsSpec(
        PrometheusExtraArgs,
        {
            "aggregation_method": _one_of(PROMETHEUS_AGGREGATIONS),
            "query_function": _one_of(PROMETHEUS_QUERY_FUNCTIONS),
            "range_function": _one_of(PROMETHEUS_RANGE_FUNCTIONS),
            "query_prefix": _text(allow_empty=True),
            "query_suffix": _text(allow_empty=True),
        },
        name_patterns=(METRIC_NAME, LABEL_NAME),
    ),
    "gnocchi": _ExtraArgsSpec(
        GnocchiExtraArgs,
        {
            "resource_type": _text(allow_empty=False),
            "resource_key": _text(allow_empty=False),
            "aggregation_method": _one_of(
                GNOCCHI_AGGREGATIONS,
                "mean, sum, last, max, min, std, median, first, count, <1-99>pct, or rate:<one of them>",
            ),
            "re_aggregation_method": _one_of(
                GNOCCHI_RE_AGGREGATIONS, "mean, sum, last, max, min, std, median, first, count, or rate:<one of them>"
            ),
            "force_granularity": lambda where, value: where.integer(value, 0),
            "use_all_resource_revisions": lambda where, value: where.boolean(value),
            "custom_query": _text(allow_empty=True),
        },
        section_required=True,
    ),
    "file": _ExtraArgsSpec(FileExtraArgs, {"aggregation_method": _one_of(FILE_AGGREGATIONS)}),
}
"""``extra_args`` schema per collector backend; a new collector registers its own here."""


def _extra_args(where: Where, raw: dict[str, Any], collector: str) -> ExtraArgs:
    spec = EXTRA_ARGS[collector]
    if "extra_args" not in raw:
        if spec.section_required:
            raise where.key("extra_args").error(f"required key is missing (the {collector} collector needs it)")
        return spec.cls()
    where = where.key("extra_args")
    required = [f.name for f in fields(spec.cls) if f.default is MISSING]
    values = where.mapping(raw["extra_args"], required=required, optional=spec.validators)
    return spec.cls(**{name: spec.validators[name](where.key(name), value) for name, value in values.items()})


def _check_names(
    where: Where, name: str, groupby: list[str], metadata: tuple[str, ...], scope_key: str,
    patterns: tuple[re.Pattern[str], re.Pattern[str]] | None,
) -> None:
    """Refuse names the backend's query language cannot express (Prometheus: PromQL identifiers)."""
    if patterns is None:
        return
    metric_pattern, label_pattern = patterns
    if not metric_pattern.fullmatch(name):
        raise where.error(f"not a Prometheus metric name (expected {metric_pattern.pattern})", name)
    for section, keys in (("groupby", groupby), ("metadata", metadata)):
        for i, key in enumerate(keys):
            if not label_pattern.fullmatch(key):
                at, why = where.key(section).index(i), ""
                if key == scope_key:
                    at, why = where.key(section), " (the scope_key of ratebeam.yaml, always in groupby)"
                raise at.error(f"not a Prometheus label name (expected {label_pattern.pattern}){why}", key)


# ---- one metric definition (spec §2.2) ----

_METRIC_KEYS = (
    "unit",
    "factor",
    "offset",
    "alt_name",
    "groupby",
    "metadata",
    "mutate",
    "mutate_map",
    "extra_args",
    "description",
    "skip_datapoints_expression",
)


def _metric(where: Where, name: str, raw: object, scope_key: str, collector: str) -> MetricDef:
    values = where.mapping(raw, required=("unit",), optional=_METRIC_KEYS)
    unit = where.key("unit").string(values["unit"])
    factor = _factor(where.key("factor"), values.get("factor", 1))
    offset = _factor(where.key("offset"), values.get("offset", 0))
    alt_name = where.key("alt_name").string(values["alt_name"]) if "alt_name" in values else None
    extra_args = _extra_args(where, values, collector)

    groupby = list(where.key("groupby").string_list(values.get("groupby", [])))
    metadata = where.key("metadata").string_list(values.get("metadata", []))
    appended = [scope_key]
    if isinstance(extra_args, GnocchiExtraArgs):
        appended.append(extra_args.resource_key)  # collector/gnocchi.py:194-195
    groupby += [key for key in dict.fromkeys(appended) if key not in groupby]
    for i, key in enumerate(metadata):
        if key in groupby:
            why = " (it is always added to groupby)" if key in appended else ""
            raise where.key("metadata").index(i).error(f"also in groupby: a key may not be in both{why}", key)
    _check_names(where, name, groupby, metadata, scope_key, EXTRA_ARGS[collector].name_patterns)

    mutate_text = values.get("mutate", "NONE")
    if not isinstance(mutate_text, str) or mutate_text not in Mutate.__members__:
        raise where.key("mutate").error(f"unknown mutate {mutate_text!r} (expected {', '.join(Mutate)})")
    mutate = Mutate(mutate_text)
    mutate_map = None
    if mutate is Mutate.MAP and "mutate_map" not in values:
        raise where.key("mutate_map").error("required when mutate is MAP")
    if "mutate_map" in values:
        map_where = where.key("mutate_map")
        if mutate is not Mutate.MAP:
            raise map_where.error(f"only allowed with mutate: MAP (mutate is {mutate.value})")
        raw_map = values["mutate_map"]
        if not isinstance(raw_map, dict):
            raise map_where.error("expected a mapping of numbers to numbers", raw_map)
        mutate_map = FrozenMap(
            {_map_key(map_where.key(k), k): _map_value(map_where.key(k), v) for k, v in raw_map.items()}
        )

    description = where.key("description").string(values["description"]) if "description" in values else None
    skip = None
    if "skip_datapoints_expression" in values:
        skip_where = where.key("skip_datapoints_expression")
        text = skip_where.string(values["skip_datapoints_expression"])
        try:
            skip = parse_skip(text)
        except SkipExpressionError as exc:
            raise skip_where.error(exc.reason, text) from None
        collected = {"groupby": set(groupby) | set(TIME_KEYS), "metadata": set(metadata)}
        for section, key in sorted(skip.labels()):
            if key not in collected[section]:
                raise skip_where.error(
                    f"reads {section}.{key}, which this metric does not collect (it would always be missing)", text
                )

    return MetricDef(
        key=KEY_SEPARATOR.join([name, alt_name]) if alt_name else name,
        name=name,
        rating_type=alt_name or name,
        unit=unit,
        factor=factor,
        offset=offset,
        mutate=mutate,
        mutate_map=mutate_map,
        groupby=tuple(groupby),
        metadata=metadata,
        description=description,
        skip_datapoints_expression=skip,
        extra_args=extra_args,
    )


def parse_metrics(document: object, source: str, scope_key: str = "project_id", collector: str = "file") -> MetricsConfig:
    """Validate a loaded ``metrics.yml`` document; errors name ``source``."""
    if collector not in EXTRA_ARGS:
        raise ValueError(f"no metrics.yml extra_args schema for collector {collector!r}")
    top = Where(source)
    top.mapping(document, required=("metrics",))
    where = top.key("metrics")
    entries = document["metrics"]  # type: ignore[index]
    if not isinstance(entries, dict) or not entries:
        raise where.error("expected a non-empty mapping of metric names to definitions", entries)

    metrics: list[MetricDef] = []
    key_at: dict[str, str] = {}
    type_at: dict[str, str] = {}
    for name, definitions in entries.items():
        if not isinstance(name, str) or not name or KEY_SEPARATOR in name:
            raise where.error(f"metric names must be non-empty strings without {KEY_SEPARATOR!r}", name)
        metric_where = where.key(name)
        if isinstance(definitions, list):
            if not definitions:
                raise metric_where.error("expected a metric definition or a non-empty list of them", definitions)
            located = [(metric_where.index(i), d) for i, d in enumerate(definitions)]
        else:
            located = [(metric_where, definitions)]
        for def_where, raw in located:
            metric = _metric(def_where, name, raw, scope_key, collector)
            if metric.key in key_at:
                raise def_where.error(
                    f"metric key {metric.key!r} is already defined by {key_at[metric.key]} "
                    "(CloudKitty refuses this too: give one of them a different alt_name)"
                )
            if metric.rating_type in type_at:
                raise def_where.error(
                    f"rating type {metric.rating_type!r} is already produced by {type_at[metric.rating_type]}; "
                    "CloudKitty would silently keep only one of them (frames are keyed by rating type): "
                    "give one of them a different alt_name"
                )
            key_at[metric.key] = def_where.path
            type_at[metric.rating_type] = def_where.path
            metrics.append(metric)
    return MetricsConfig(tuple(metrics))


def load_metrics(path: str | Path, scope_key: str = "project_id", collector: str = "file") -> MetricsConfig:
    """Read and validate ``metrics.yml`` for ``collector`` (whose ``extra_args`` schema applies)."""
    source = str(path)
    return parse_metrics(read_yaml(path, source), source, scope_key, collector)
