"""The ``prometheus`` collector: CloudKitty's Prometheus collector (spec §3.1), safely quoted.

For one scope × period × metric it sends CloudKitty's PromQL (``connectors.promql.collect_query``) as
an instant query at the period end and turns each returned series into one usage point: the groupby
and metadata labels (a label the series lacks is ``''``, as in CloudKitty), the quantity with
CloudKitty's 9-significant-digit half-up rule (``NumericContext.PROMETHEUS9``: value, factor, offset
and mutate), price 0, the metric's unit and the time keys.  A NaN or infinite sample gives no point.

``batched`` mode (off by default) sends one query per metric × period for *all* scopes (the same
query without the scope matcher; the scope key is a ``by`` label, so nothing is aggregated across
scopes), splits the result per scope and keeps it in a bounded cache, so the per-scope calls of the
same period and metric are served without a request.  Both modes give the same points as long as
``query_prefix``/``query_suffix`` keep the scope label (they are pasted around the whole query).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.collectors.prometheus.client import PrometheusClient, PrometheusConnection
from ratebeam.connectors.collectors.prometheus.promql import collect_query, labels
from ratebeam.connectors.errors import NoDataCollected
from ratebeam.transforms import schema
from ratebeam.transforms.conversion import NumericContext, convert_qty
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.schema import groupby_column, metadata_column
from ratebeam.transforms.usage_batch import usage_columns

#: How many points batched mode keeps (least recently used (metric, period) results are dropped first;
#: frames arrive shuffled, not period by period, so a dropped result is simply queried again).
CACHE_POINTS = 1_000_000


class PrometheusCollector(Collector):
    """Collects usage with PromQL instant queries; see the module docstring."""

    name = "prometheus"

    def __init__(
        self, connection: PrometheusConnection, scope_key: str = "project_id", batched: bool = False,
        client: PrometheusClient | None = None,
    ) -> None:
        self._scope_key = scope_key
        self._batched = batched
        self._client = client or PrometheusClient(connection)
        self._cache: OrderedDict[tuple[str, datetime, datetime], dict[str, pa.RecordBatch]] = OrderedDict()
        self._cached_points = 0

    @property
    def requests(self) -> int:
        """HTTP requests sent so far (retries included)."""
        return self._client.requests

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        if self._batched:
            batch = self._all_scopes(begin, end, metric).get(scope_id)
        else:
            series = self._client.query(self._query(metric, begin, end, scope_id), end)
            batch = self._points(series, begin, end, metric, scope_id).get(scope_id)
        if batch is None:
            raise NoDataCollected(f"{metric.name}: no series for scope {scope_id} in [{begin}, {end})")
        return batch

    def _query(self, metric: MetricDef, begin: datetime, end: datetime, scope_id: str | None) -> str:
        period = abs(int((end - begin).total_seconds()))
        return collect_query(metric, period, self._scope_key, scope_id)

    def _all_scopes(self, begin: datetime, end: datetime, metric: MetricDef) -> dict[str, pa.RecordBatch]:
        key = (metric.key, begin, end)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        series = self._client.query(self._query(metric, begin, end, None), end)
        batches = self._points(series, begin, end, metric, None)
        self._cache[key] = batches
        self._cached_points += sum(b.num_rows for b in batches.values())
        while self._cached_points > CACHE_POINTS and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            self._cached_points -= sum(b.num_rows for b in dropped.values())
        return batches

    def _points(
        self, series: list[dict[str, Any]], begin: datetime, end: datetime, metric: MetricDef, scope_id: str | None
    ) -> dict[str, pa.RecordBatch]:
        """The usage batch of each scope in ``series`` (``scope_id`` when given, else the scope label)."""
        keys = labels(metric)
        rows: dict[str, list[Any]] = {k: [] for k in (schema.SCOPE, "value", *keys)}
        for item in series:
            found = item.get("metric") or {}
            scope = scope_id if scope_id is not None else found.get(self._scope_key, "")
            if not scope:
                continue  # batched mode: a series without the scope label belongs to no scope
            rows[schema.SCOPE].append(scope)
            rows["value"].append(str(item["value"][1]))
            for k in keys:
                rows[k].append(str(found.get(k, "")))
        if not rows[schema.SCOPE]:
            return {}
        frame = pl.DataFrame(rows, schema={k: pl.String for k in rows})
        converted = convert_qty(frame.lazy(), "value", metric, NumericContext.PROMETHEUS9)
        usage = (
            usage_columns(converted, metric, pl.lit(begin), pl.lit(end))
            .sort(schema.SCOPE, *(groupby_column(k) for k in metric.groupby),
                  *(metadata_column(k) for k in metric.metadata))
            .collect(engine="in-memory")
        )
        return {
            str(scope[0]): part.to_arrow().combine_chunks().to_batches()[0]
            for scope, part in usage.partition_by(schema.SCOPE, as_dict=True, maintain_order=True).items()
        }

    def close(self) -> None:
        self._client.close()
