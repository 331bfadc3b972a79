"""The ``prometheus`` collector: CloudKitty's Prometheus collector (`cloudkitty/collector/prometheus_base.py:115-174`), safely quoted.

For one scope × period × metric it sends CloudKitty's PromQL (``promql.collect_query``) as an
instant query at the period end and returns each series as one raw sample: its groupby and metadata
labels (a label the series lacks is ``''``, as in CloudKitty) and its value as Prometheus printed it.
A NaN or infinite sample is no sample (counted: ``samples_not_finite``); a sample that is not a
number at all (``"abc"``) refuses the query, so its frame fails instead of silently losing usage.
``ConvertUsage`` then applies CloudKitty's 9-significant-
digit half-up rule (``numeric_context = PROMETHEUS9``: value, factor, offset and mutate).

``collect_all`` sends one query per metric × period for *all* scopes (the same query without the
scope matcher; the scope key is a ``by`` label, so nothing is aggregated across scopes) and splits
the result per scope; the graph's batched stage calls it once per (period, metric) for every metric
``promql.batchable`` accepts (the default; ``batched`` in ``config.py``).  Both give the same
samples as long as ``query_prefix``/``query_suffix`` keep each scope's series apart (they are
pasted around the whole query), which ``batchable`` only accepts when it is proven.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pyarrow as pa

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.collectors.prometheus.client import (
    PrometheusClient,
    PrometheusConnection,
    PrometheusQueryRefused,
)
from ratebeam.connectors.collectors.prometheus.promql import collect_query
from ratebeam.connectors.collectors.samples import sample_rows, scope_batches
from ratebeam.connectors.errors import NoDataCollected
from ratebeam.transforms import schema
from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.convert_usage import VALUE, label_keys
from ratebeam.transforms.metric_defs import MetricDef


class PrometheusCollector(Collector):
    """Collects raw samples with PromQL instant queries; see the module docstring."""

    name = "prometheus"
    numeric_context = NumericContext.PROMETHEUS9

    def __init__(
        self, connection: PrometheusConnection, scope_key: str = "project_id", client: PrometheusClient | None = None,
    ) -> None:
        self._scope_key = scope_key
        self._client = client or PrometheusClient(connection)
        self._not_finite = 0

    @property
    def requests(self) -> int:
        """HTTP requests sent so far (retries included)."""
        return self._client.requests

    def counts(self) -> dict[str, int]:
        """The HTTP attempts so far (``prometheus_requests``, Aetos' included) and the NaN/Inf samples left out."""
        return {"prometheus_requests": self.requests, "samples_not_finite": self._not_finite}

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """One range query for the scope; ``NoDataCollected`` when Prometheus returns no series."""
        promql = self._query(metric, begin, end, scope_id)
        batch = self._samples(self._client.query(promql, end), promql, begin, end, metric, scope_id).get(scope_id)
        if batch is None:
            raise NoDataCollected(f"{metric.name}: no series for scope {scope_id} in [{begin}, {end})")
        return batch

    def collect_all(self, begin: datetime, end: datetime, metric: MetricDef) -> dict[str, pa.RecordBatch]:
        """One range query without the scope matcher, its series split by the scope label."""
        promql = self._query(metric, begin, end, None)
        return self._samples(self._client.query(promql, end), promql, begin, end, metric, None)

    def _query(self, metric: MetricDef, begin: datetime, end: datetime, scope_id: str | None) -> str:
        period = abs(int((end - begin).total_seconds()))
        return collect_query(metric, period, self._scope_key, scope_id)

    def _samples(
        self, series: list[dict[str, Any]], promql: str, begin: datetime, end: datetime, metric: MetricDef,
        scope_id: str | None,
    ) -> dict[str, pa.RecordBatch]:
        """The raw samples of each scope in ``series`` (``scope_id`` when given, else the scope label).

        ``series`` were checked by the client (``metric`` and ``value`` have their documented types).
        """
        keys = label_keys(metric)
        rows = sample_rows(metric)
        for item in series:
            found = item.get("metric") or {}
            scope = scope_id if scope_id is not None else found.get(self._scope_key, "")
            value = item["value"][1]
            if not scope:
                continue  # no scope label (batched mode: it belongs to no scope)
            if not _finite(value, found, promql):
                self._not_finite += 1
                continue
            rows[schema.SCOPE].append(scope)
            rows[VALUE].append(value)
            for k in keys:
                rows[k].append(str(found.get(k, "")))
        return scope_batches(rows, metric, begin, end)

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        self._client.close()


def _finite(value: str, labels: dict[str, str], promql: str) -> bool:
    """Whether Prometheus' text of a sample is a finite number (``NaN``, ``+Inf``, ``-Inf`` are not).

    Text that is no number at all refuses the query (``PrometheusQueryRefused``) naming the series.
    """
    try:
        return math.isfinite(float(value))
    except ValueError:
        raise PrometheusQueryRefused(
            promql, f"prometheus: sample value is not a number: {value[:100]!r} (series {str(labels)[:200]})"
        ) from None
