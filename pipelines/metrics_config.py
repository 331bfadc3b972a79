"""Loads ``metrics.yml`` with CloudKitty's schema and semantics into a typed ``MetricsConfig``.

CloudKitty's format is read as is (`cloudkitty/collector/__init__.py:64-119`): ``{metrics: {name: definition | [definitions]}}``,
the base schema of ``collector/__init__.py:81-119``, ``check_configuration``'s ``name@#alt_name``
keys with the scope key appended to ``groupby`` (``cloudkitty/collector/__init__.py:190-227``), each collector's ``extra_args`` with its
defaults (``cloudkitty/collector/prometheus_base.py:37-60``, ``pipelines.metrics_extra_args``), and the checks CloudKitty only does in
``validate_conf`` (a key in both groupby and metadata; ``MAP`` <-> ``mutate_map``).  Stricter than
CloudKitty, each with a clear message: two definitions with the same rating type (CloudKitty
silently keeps one), duplicate YAML keys (PyYAML silently keeps the last), ``mutate_map`` keys that
are booleans, other non-numbers or texts that are no number (``a: 2``), a label listed twice, a
``skip_datapoints_expression`` outside the safe language of ``transforms.skip_expression`` or
reading a label the metric does not collect, booleans and non-finite numbers where numbers are
expected.  A string ``mutate_map`` key holding a number (``'3': 4``) is valid for CloudKitty and never
matches: it is accepted, with a warning, and dropped.

The file is validated by pydantic models (the scope key and the collector come as validation
context); every error is one ``InputError`` naming the file, the key path and the value.
"""

from __future__ import annotations

import logging
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BeforeValidator, Discriminator, Tag, ValidationInfo, model_validator

from ratebeam.connectors.config_model import NOTHING, ConfigModel, Invalid, NonEmptyStr, StringList
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.metrics_extra_args import EXTRA_ARGS
from ratebeam.pipelines.validation import key_path, validate
from ratebeam.pipelines.yaml_loader import read_yaml
from ratebeam.transforms.metric_defs import (
    KEY_SEPARATOR,
    FrozenMap,
    MetricDef,
    MetricsConfig,
    Mutate,
)
from ratebeam.transforms.schema import TIME_KEYS
from ratebeam.transforms.skip_expression import SkipExpression, SkipExpressionError, parse_skip

LOG = logging.getLogger(__name__)

# ---- numbers, as CloudKitty's num2decimal sees them (`cloudkitty/utils/__init__.py:250-292`) ----


def _finite(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid("not a finite number", value)
    return value


def _factor(value: object) -> Decimal:
    """``Any(int, float, Coerce(Fraction))`` then ``num2decimal``: exact int, float's binary expansion."""
    if isinstance(value, bool):
        raise Invalid("not a number or fraction")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(_finite(value))
    if isinstance(value, str):
        try:
            fraction = Fraction(value)
        except (ValueError, ZeroDivisionError):
            raise Invalid("not a number or fraction") from None
        try:
            number = float(fraction)
        except OverflowError:
            raise Invalid("number too large") from None
        if number == 0 and fraction != 0:  # CloudKitty would bill every quantity as 0
            raise Invalid("not 0, but its float is 0.0 (CloudKitty computes with the float of a fraction)")
        return Decimal(number)
    raise Invalid("not a number or fraction")


def _map_key(key: object) -> Decimal:
    """A ``mutate_map`` key as the exact ``Decimal`` CloudKitty looks the qty up with.

    CloudKitty looks a ``Decimal`` qty up in the dict, so it matches exactly the number whose value
    equals the YAML int or float (``Decimal(float)``, the binary expansion).  A string key is valid
    for CloudKitty and never matches: ``_mutate_map`` drops it (``parse_metrics`` warns).
    """
    if isinstance(key, bool) or not isinstance(key, int | float):
        raise Invalid(
            "mutate_map keys must be numbers (CloudKitty looks the quantity up as a Decimal, "
            "so a key of another type never matches)",
            key,
            (key,),
        )
    if isinstance(key, float) and (key != key or key in (float("inf"), float("-inf"))):
        raise Invalid("not a finite number", key, (key,))
    return Decimal(key)


def _map_value(key: object, value: object) -> Decimal:
    """A ``mutate_map`` value as CloudKitty's DataPoint makes it a qty: a float via ``str()``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Invalid("expected a number", value, (key,))
    try:
        number = Decimal(str(value) if isinstance(value, float) else value)
    except ArithmeticError:
        raise Invalid("expected a number", value, (key,)) from None
    if not number.is_finite():
        raise Invalid("not a finite number", value, (key,))
    return number


def _refuse_word_key(key: str) -> None:
    """A string ``mutate_map`` key that is no number's text (``a``) is a mistake, not CloudKitty's quirk.

    CloudKitty accepts it, and no quantity ever matches it: MAP would give every quantity 0
    without a word.  A number's text (``'3'``) never matches either; it is kept, with a warning
    (``parse_metrics``), as CloudKitty keeps it: the number shows what was meant.
    """
    try:
        number = Decimal(key)
    except InvalidOperation:
        number = Decimal("NaN")
    if not number.is_finite():
        raise Invalid("not a number: a mutate_map key is the quantity it maps, so this one never matches", key,
                      (key,))


def _mutate_map(raw: object) -> FrozenMap:
    if not isinstance(raw, dict):
        raise Invalid("expected a mapping of numbers to numbers")
    for key in raw:
        if isinstance(key, str):
            _refuse_word_key(key)
    return FrozenMap({_map_key(k): _map_value(k, v) for k, v in raw.items() if not isinstance(k, str)})


def _mutate(value: object) -> Mutate:
    if not isinstance(value, str) or value not in Mutate.__members__:
        raise Invalid(f"unknown mutate {value!r} (expected {', '.join(Mutate)})", NOTHING)
    return Mutate(value)


def _skip(value: object) -> SkipExpression:
    if not isinstance(value, str) or not value:
        raise Invalid("expected a non-empty string")
    try:
        return parse_skip(value)
    except SkipExpressionError as exc:
        raise Invalid(exc.reason) from None


# ---- one metric definition (`cloudkitty/collector/__init__.py:81-119`) ----

Args = TypeVar("Args", bound=ConfigModel)
Number = Annotated[Decimal, BeforeValidator(_factor)]


class Definition(ConfigModel, Generic[Args]):
    """One definition as written; ``extra_args`` is the configured collector's model."""

    model_config = ConfigModel.model_config | {"arbitrary_types_allowed": True}

    unit: NonEmptyStr
    factor: Number = Decimal(1)
    offset: Number = Decimal(0)
    alt_name: NonEmptyStr | None = None
    groupby: StringList = ()
    metadata: StringList = ()
    mutate: Annotated[Mutate, BeforeValidator(_mutate)] = Mutate.NONE
    mutate_map: Annotated[FrozenMap, BeforeValidator(_mutate_map)] | None = None
    extra_args: Args | None = None
    description: NonEmptyStr | None = None
    skip_datapoints_expression: Annotated[SkipExpression, BeforeValidator(_skip)] | None = None

    def full_groupby(self, scope_key: str) -> tuple[str, ...]:
        """``groupby`` with the scope key (and Gnocchi's ``resource_key``) appended, once (``cloudkitty/collector/__init__.py:190-227``)."""
        appended = [scope_key] + ([self.extra_args.resource_key] if hasattr(self.extra_args, "resource_key") else [])
        return (*self.groupby, *(key for key in dict.fromkeys(appended) if key not in self.groupby))

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Definition:
        scope_key, collector = info.context["scope_key"], info.context["collector"]
        if self.extra_args is None and EXTRA_ARGS[collector].section_required:
            raise Invalid(f"required key is missing (the {collector} collector needs it)", NOTHING, ("extra_args",))
        groupby = self.full_groupby(scope_key)
        for i, key in enumerate(self.metadata):
            if key in groupby:
                why = " (it is always added to groupby)" if key not in self.groupby else ""
                raise Invalid(f"also in groupby: a key may not be in both{why}", key, ("metadata", i))
        if self.mutate is Mutate.MAP and self.mutate_map is None:
            raise Invalid("required when mutate is MAP", NOTHING, ("mutate_map",))
        if self.mutate is not Mutate.MAP and self.mutate_map is not None:
            raise Invalid(f"only allowed with mutate: MAP (mutate is {self.mutate.value})", NOTHING, ("mutate_map",))
        skip = self.skip_datapoints_expression
        if skip is not None:
            collected = {"groupby": set(groupby) | set(TIME_KEYS), "metadata": set(self.metadata)}
            for section, key in sorted(skip.labels()):
                if key not in collected[section]:
                    raise Invalid(
                        f"reads {section}.{key}, which this metric does not collect (it would always be missing)",
                        skip.text, ("skip_datapoints_expression",),
                    )
        return self


def _definitions(value: Any) -> Any:
    if not value:
        raise Invalid("expected a metric definition or a non-empty list of them")
    return tuple(value)


def _shape(value: Any) -> str:
    return "many" if isinstance(value, list | tuple) else "one"


D = TypeVar("D", bound=Definition)
Entry = Annotated[
    Annotated[D, Tag("one")] | Annotated[tuple[D, ...], BeforeValidator(_definitions), Tag("many")],
    Discriminator(_shape),
]


def _names(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        raise Invalid("expected a non-empty mapping of metric names to definitions")
    for name in value:
        if not isinstance(name, str) or not name or KEY_SEPARATOR in name:
            raise Invalid(f"metric names must be non-empty strings without {KEY_SEPARATOR!r}", name)
    return value


class MetricsFile(ConfigModel, Generic[D]):
    """The whole ``metrics.yml``."""

    metrics: Annotated[dict[str, Entry[D]], BeforeValidator(_names)]

    def located(self) -> list[tuple[tuple[Any, ...], str, D]]:
        """(key path, path as shown, definition) of every definition, in file order."""
        out = []
        for name, entry in self.metrics.items():
            if isinstance(entry, tuple):
                out += [(("metrics", name, i), f"metrics.{name}[{i}]", d) for i, d in enumerate(entry)]
            else:
                out.append((("metrics", name), f"metrics.{name}", entry))
        return out


# ---- the file ----


def _check_names(at: tuple[Any, ...], name: str, metric: Definition, groupby: tuple[str, ...], scope_key: str,
                 collector: str) -> None:
    """Refuse names the backend's query language cannot express (Prometheus: PromQL identifiers)."""
    patterns = EXTRA_ARGS[collector].name_patterns
    if patterns is None:
        return
    metric_pattern, label_pattern = patterns
    if not metric_pattern.fullmatch(name):
        raise Invalid(f"not a Prometheus metric name (expected {metric_pattern.pattern})", name, at)
    for section, keys in (("groupby", groupby), ("metadata", metric.metadata)):
        for i, key in enumerate(keys):
            if not label_pattern.fullmatch(key):
                where, why = (*at, section, i), ""
                if key == scope_key:
                    where, why = (*at, section), " (the scope_key of ratebeam.yaml, always in groupby)"
                raise Invalid(f"not a Prometheus label name (expected {label_pattern.pattern}){why}", key, where)


def _metric_def(name: str, metric: Definition, groupby: tuple[str, ...], collector: str) -> MetricDef:
    return MetricDef(
        key=KEY_SEPARATOR.join([name, metric.alt_name]) if metric.alt_name else name,
        name=name,
        rating_type=metric.alt_name or name,
        unit=metric.unit,
        factor=metric.factor,
        offset=metric.offset,
        mutate=metric.mutate,
        mutate_map=metric.mutate_map,
        groupby=groupby,
        metadata=metric.metadata,
        description=metric.description,
        skip_datapoints_expression=metric.skip_datapoints_expression,
        extra_args=EXTRA_ARGS[collector].build(metric.extra_args),
    )


def _metrics_config(document: MetricsFile, scope_key: str, collector: str) -> MetricsConfig:
    """The definitions as ``MetricDef``s, refusing keys or rating types defined twice."""
    metrics: list[MetricDef] = []
    key_at: dict[str, str] = {}
    type_at: dict[str, str] = {}
    for at, shown, definition in document.located():
        groupby = definition.full_groupby(scope_key)
        _check_names(at, at[1], definition, groupby, scope_key, collector)
        metric = _metric_def(at[1], definition, groupby, collector)
        if metric.key in key_at:
            raise Invalid(
                f"metric key {metric.key!r} is already defined by {key_at[metric.key]} "
                "(CloudKitty refuses this too: give one of them a different alt_name)", NOTHING, at,
            )
        if metric.rating_type in type_at:
            raise Invalid(
                f"rating type {metric.rating_type!r} is already produced by {type_at[metric.rating_type]}; "
                "CloudKitty would silently keep only one of them (frames are keyed by rating type): "
                "give one of them a different alt_name", NOTHING, at,
            )
        key_at[metric.key] = type_at[metric.rating_type] = shown
        metrics.append(metric)
    return MetricsConfig(tuple(metrics))


def parse_metrics(document: object, source: str, scope_key: str = "project_id", collector: str = "file") -> MetricsConfig:
    """Validate a loaded ``metrics.yml`` document; errors name ``source``."""
    if collector not in EXTRA_ARGS:
        raise ValueError(f"no metrics.yml extra_args schema for collector {collector!r}")
    model = MetricsFile[Definition[EXTRA_ARGS[collector].model]]
    context = {"scope_key": scope_key, "collector": collector}
    parsed = validate(model, document, source, context)
    _warn_string_map_keys(document, parsed, source)
    try:
        return _metrics_config(parsed, scope_key, collector)
    except Invalid as exc:
        value = () if exc.value is NOTHING else (exc.value,)
        raise InputError(source, key_path(document, exc.at), exc.message, *value) from None


def _warn_string_map_keys(document: Any, parsed: MetricsFile, source: str) -> None:
    """Warn about each ``mutate_map`` string key: CloudKitty accepts it and it never matches a qty."""
    for at, shown, _ in parsed.located():
        raw = document
        for part in at:
            raw = raw[part]
        for key in raw.get("mutate_map") or {}:
            if isinstance(key, str):
                LOG.warning("%s: %s.mutate_map.%s: a string key never matches a quantity (CloudKitty looks "
                            "the quantity up as a number): ignored, as CloudKitty does; write it unquoted",
                            source, shown, key)


def load_metrics(path: str | Path, scope_key: str = "project_id", collector: str = "file") -> MetricsConfig:
    """Read and validate ``metrics.yml`` for ``collector`` (whose ``extra_args`` schema applies)."""
    source = str(path)
    return parse_metrics(read_yaml(path, source), source, scope_key, collector)
