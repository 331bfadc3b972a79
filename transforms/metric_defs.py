"""One metric of ``metrics.yml`` as a typed, frozen value (`cloudkitty/collector/__init__.py:64-119`).

``pipelines.metrics_config`` validates the YAML once and builds these objects; collectors, the
conversion and the skip filter only ever see them.  Everything here is immutable and picklable
because Beam ships the metric list to every worker.

Numbers follow CloudKitty's ``num2decimal`` (`cloudkitty/utils/__init__.py:250-292`): ``factor`` and ``offset`` are the *exact*
``Decimal`` of what CloudKitty computes with (a YAML float or a ``"a/b"`` fraction is the exact
binary expansion of the float, e.g. ``0.001`` is ``0.001000000000000000020816681711721685...``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from ratebeam.transforms.skip_expression import SkipExpression

#: Separator CloudKitty puts between a metric name and its ``alt_name`` in the metric key (`cloudkitty/collector/__init__.py:190-227`).
KEY_SEPARATOR = "@#"


class Mutate(StrEnum):
    """Post-conversion transform of the quantity (`cloudkitty/collector/__init__.py:81-119`)."""

    NONE = "NONE"
    NUMBOOL = "NUMBOOL"
    NOTNUMBOOL = "NOTNUMBOOL"
    FLOOR = "FLOOR"
    CEIL = "CEIL"
    MAP = "MAP"


class FrozenMap(Mapping[Decimal, Decimal]):
    """An immutable, hashable, picklable ``Decimal -> Decimal`` mapping (``mutate_map``).

    Keys compare as numbers, like CloudKitty's ``dict.get(Decimal qty)``: ``Decimal('1')`` and
    ``Decimal('1.0')`` are the same key.
    """

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[Decimal, Decimal] | tuple[tuple[Decimal, Decimal], ...] = ()) -> None:
        self._data: dict[Decimal, Decimal] = dict(items)

    def __getitem__(self, key: Decimal) -> Decimal:
        return self._data[key]

    def __iter__(self) -> Iterator[Decimal]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[tuple[tuple[Decimal, Decimal], ...]]]:
        return (FrozenMap, (tuple(self._data.items()),))


# ---- collector-specific ``extra_args`` (`cloudkitty/collector/prometheus_base.py:37-60`), each with CloudKitty's defaults ----

PROMETHEUS_AGGREGATIONS = frozenset({"avg", "count", "max", "min", "stddev", "stdvar", "sum"})
PROMETHEUS_QUERY_FUNCTIONS = frozenset({"abs", "ceil", "exp", "floor", "ln", "log2", "log10", "round", "sqrt"})
PROMETHEUS_RANGE_FUNCTIONS = frozenset({"changes", "delta", "deriv", "idelta", "irange", "irate", "rate"})

_GNOCCHI_BASIC = ("mean", "sum", "last", "max", "min", "std", "median", "first", "count")
#: ``re_aggregation_method``: the basic methods and ``rate:<basic>`` (``collector/gnocchi.py:87-91``).
GNOCCHI_RE_AGGREGATIONS = frozenset(_GNOCCHI_BASIC) | {f"rate:{m}" for m in _GNOCCHI_BASIC}
_GNOCCHI_PCT = frozenset(f"{i}pct" for i in range(1, 100))
#: ``aggregation_method``: the above plus ``<1..99>pct`` and ``rate:<n>pct`` (``collector/gnocchi.py:93-101``).
GNOCCHI_AGGREGATIONS = GNOCCHI_RE_AGGREGATIONS | _GNOCCHI_PCT | {f"rate:{p}" for p in _GNOCCHI_PCT}

#: The file collector's ways of folding several samples of one series in a period into one value.
FILE_AGGREGATIONS = frozenset({"max", "min", "sum", "avg", "count", "last"})


@dataclass(frozen=True)
class PrometheusExtraArgs:
    """``extra_args`` of the Prometheus collector (``collector/prometheus_base.py:37-60``)."""

    aggregation_method: str = "max"
    query_function: str | None = None
    range_function: str | None = None
    query_prefix: str = ""
    query_suffix: str = ""


@dataclass(frozen=True)
class GnocchiExtraArgs:
    """``extra_args`` of the Gnocchi collector (``collector/gnocchi.py:105-133``); required there."""

    resource_type: str
    resource_key: str = "id"
    aggregation_method: str = "max"
    re_aggregation_method: str = "max"
    force_granularity: int = 3600
    use_all_resource_revisions: bool = True
    custom_query: str = ""


@dataclass(frozen=True)
class FileExtraArgs:
    """``extra_args`` of ratebeam's file collector: how samples of one series in a period fold."""

    aggregation_method: str = "max"


ExtraArgs = PrometheusExtraArgs | GnocchiExtraArgs | FileExtraArgs


@dataclass(frozen=True)
class MetricDef:
    """One entry of ``metrics.yml`` after CloudKitty's ``check_configuration`` (`cloudkitty/collector/__init__.py:81-227`).

    ``key`` is ``name`` or ``name@#alt_name``; ``name`` is what the collector queries;
    ``rating_type`` (``alt_name`` or ``name``) is the frame key and the hashmap service name.
    ``groupby`` already ends with the scope key (and Gnocchi's ``resource_key``) when absent.
    ``mutate_map`` is set exactly when ``mutate`` is ``MAP``.
    """

    key: str
    name: str
    rating_type: str
    unit: str
    factor: Decimal = Decimal(1)
    offset: Decimal = Decimal(0)
    mutate: Mutate = Mutate.NONE
    mutate_map: FrozenMap | None = None
    groupby: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    description: str | None = None
    skip_datapoints_expression: SkipExpression | None = None
    extra_args: ExtraArgs = field(default_factory=FileExtraArgs)


@dataclass(frozen=True)
class MetricsConfig:
    """Every metric of one ``metrics.yml``, in file order; rating types and keys are unique."""

    metrics: tuple[MetricDef, ...]
    _by_type: dict[str, MetricDef] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_type = {m.rating_type: m for m in self.metrics}
        keys = {m.key for m in self.metrics}
        if len(by_type) != len(self.metrics) or len(keys) != len(self.metrics):
            raise ValueError("metric keys and rating types must be unique")
        object.__setattr__(self, "_by_type", by_type)

    def by_rating_type(self, rating_type: str) -> MetricDef:
        """The metric whose frame key / hashmap service name is ``rating_type`` (KeyError if none)."""
        return self._by_type[rating_type]

    @property
    def rating_types(self) -> tuple[str, ...]:
        """The rating types, in file order."""
        return tuple(self._by_type)
