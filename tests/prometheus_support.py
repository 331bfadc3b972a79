"""Helpers for the Prometheus tests: metric definitions as CloudKitty's metrics.yml gives them, and
expected quantities computed by hand from the generated samples (``servers.prometheus.SERIES``)."""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timedelta
from decimal import Decimal

import polars as pl
import pyarrow as pa
from servers.prometheus import START, Series

from ratebeam.connectors.collectors.prometheus.client import PrometheusConnection
from ratebeam.connectors.collectors.prometheus.collector import PrometheusCollector
from ratebeam.pipelines.metrics_config import parse_metrics
from ratebeam.transforms.conversion import NumericContext, convert_value
from ratebeam.transforms.convert_usage import convert_samples
from ratebeam.transforms.metric_defs import MetricDef

HOUR = 3600


def metric(name: str, scope_key: str = "project_id", **definition) -> MetricDef:
    """One metrics.yml definition, validated for the prometheus collector (scope key appended)."""
    definition.setdefault("unit", "u")
    return parse_metrics({"metrics": {name: definition}}, "metrics.yml", scope_key, "prometheus").metrics[0]


def period(hour: int) -> tuple[datetime, datetime]:
    begin = START + timedelta(hours=hour)
    return begin, begin + timedelta(hours=1)


def collector(api: str, **connection) -> PrometheusCollector:
    connection.setdefault("timeout", 10)
    connection.setdefault("retries", 0)
    return PrometheusCollector(PrometheusConnection(api, **connection), "project_id")


def rows(batch: pa.RecordBatch) -> pl.DataFrame:
    return pl.from_arrow(batch)


def usage(col: PrometheusCollector, scope: str, begin: datetime, end: datetime, m: MetricDef) -> pl.DataFrame:
    """The usage points of one collect call: the collector's raw samples, then the pure conversion."""
    return rows(convert_samples(col.collect(scope, begin, end, m), [m], col.numeric_context))


def over_time(agg: str, values: list[float]) -> float:
    """``<agg>_over_time`` then ``<agg>(...)`` over a group of one series (every generated series has
    its own label set, so the outer aggregation sees one element)."""
    inner = {
        "max": max, "min": min, "sum": math.fsum, "count": len, "avg": statistics.fmean,
        "stddev": statistics.pstdev, "stdvar": statistics.pvariance,
    }[agg](values)
    return {"count": 1.0, "stddev": 0.0, "stdvar": 0.0}.get(agg, float(inner))


def qty(raw: float, definition: MetricDef) -> Decimal | None:
    """CloudKitty's quantity of a sample value as Prometheus prints it (9 digits, half-up)."""
    return convert_value(repr(float(raw)), definition, NumericContext.PROMETHEUS9)


def expected(series: Series, agg: str, hour: int) -> float:
    _, end = period(hour)
    return over_time(agg, series.window(end, HOUR))
