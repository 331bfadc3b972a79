"""The ``gnocchi`` collector: CloudKitty's Gnocchi collector (`cloudkitty/collector/gnocchi.py:263-596`) on the aggregates API.

For one scope × period × metric it sends CloudKitty's aggregates request — operations
``(aggregate <re_aggregation_method> (metric <name> <aggregation_method>))`` or the metric's
``custom_query``, the search ``type = <resource_type> and <scope_key> = <scope>``, ``groupby`` = the
metric's groupby (scope key and ``resource_key`` included), ``granularity`` = ``force_granularity``
(none when 0), ``use_history`` — and turns each group with aggregates into one raw sample:

* the value is the group's **first** aggregate, as CloudKitty takes it (``aggregated[0][2]``): with a
  granularity finer than the period that is the first bucket of the period, not the period's
  aggregate (CloudKitty's behaviour, kept so that the two rate the same);
* the groupby labels are the group's values (a null one is ``''``; numbers as ``str()``);
* the metadata labels come from the resource whose ``resource_key`` is the group's, found by one
  paginated search of the resources alive around the period (``started_at``/``ended_at`` widened by
  one period each side); a group whose resource is not found is skipped (CloudKitty logs and skips);
* with ``use_all_resource_revisions: false`` the groups of one ``id`` (one per revision) become one
  sample with the last revision's labels and CloudKitty's sum of quantities (``filter_revisions``).

Values are Gnocchi's JSON floats, converted exactly (``numeric_context = EXACT``, CloudKitty's
``num2decimal`` of a float).  ``collect_all`` is the same with the scope left out of both searches —
one aggregates call and one resource search per (period, metric) for every scope, split by the
scope key, which is always a groupby key, so no group spans two scopes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.collectors.gnocchi.client import GnocchiClient, GnocchiConnection
from ratebeam.connectors.collectors.gnocchi.query import (
    aggregates_search,
    aggregates_start,
    lifetime_search,
    operations,
)
from ratebeam.connectors.collectors.gnocchi.revisions import filter_revisions
from ratebeam.connectors.collectors.samples import sample_rows, scope_batches
from ratebeam.connectors.errors import FatalConnectorError, NoDataCollected
from ratebeam.transforms import schema
from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.convert_usage import VALUE, label_keys
from ratebeam.transforms.metric_defs import GnocchiExtraArgs, MetricDef

LOG = logging.getLogger(__name__)


def _text(value: Any) -> str:
    """A group or attribute value as a label: ``''`` for null or absent, else ``str()``."""
    return "" if value is None else str(value)


class GnocchiCollector(Collector):
    """Collects raw samples from Gnocchi's aggregates API; see the module docstring."""

    name = "gnocchi"
    numeric_context = NumericContext.EXACT

    def __init__(
        self, connection: GnocchiConnection, scope_key: str = "project_id", client: GnocchiClient | None = None,
    ) -> None:
        self._scope_key = scope_key
        self._client = client or GnocchiClient(connection)

    @property
    def requests(self) -> int:
        """HTTP requests sent so far (retries included)."""
        return self._client.requests

    def counts(self) -> dict[str, int]:
        """The HTTP attempts to Gnocchi so far."""
        return {"gnocchi_requests": self.requests}

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """One aggregates call (and one resource search with metadata) for the scope."""
        batch = self._collect(begin, end, metric, scope_id).get(scope_id)
        if batch is None:
            raise NoDataCollected(f"{metric.name}: no aggregates for scope {scope_id} in [{begin}, {end})")
        return batch

    def collect_all(self, begin: datetime, end: datetime, metric: MetricDef) -> dict[str, pa.RecordBatch]:
        """One aggregates call for every scope of the resource type, split by the scope key."""
        return self._collect(begin, end, metric, None)

    def _collect(
        self, begin: datetime, end: datetime, metric: MetricDef, scope_id: str | None,
    ) -> dict[str, pa.RecordBatch]:
        args = metric.extra_args
        if not isinstance(args, GnocchiExtraArgs):  # metrics.yml is loaded for this collector: never happens
            raise FatalConnectorError(f"gnocchi collector: metric {metric.key} has no gnocchi extra_args")
        groups = self._client.aggregates(
            operations(metric, args), args.resource_type, aggregates_search(args.resource_type, self._scope_key, scope_id),
            metric.groupby, aggregates_start(begin, args), end, args.force_granularity or None,
        )
        groups = [g for g in groups if g["measures"]["measures"]["aggregated"]]
        if not args.use_all_resource_revisions:
            groups = filter_revisions(groups)
        if not groups:
            return {}
        resources = self._resources(begin, end, metric, args, scope_id) if metric.metadata else None
        return scope_batches(self._rows(groups, resources, metric, args, scope_id), metric, begin, end, pl.Float64)

    def _resources(
        self, begin: datetime, end: datetime, metric: MetricDef, args: GnocchiExtraArgs, scope_id: str | None,
    ) -> dict[str, dict[str, Any]]:
        """The resources alive around the period, by their ``resource_key`` value."""
        query = lifetime_search(begin, end, self._scope_key, scope_id)
        found = self._client.search(args.resource_type, query, f"{args.resource_key}:asc")
        return {_text(r.get(args.resource_key)): r for r in found}

    def _rows(
        self, groups: Iterable[dict[str, Any]], resources: dict[str, dict[str, Any]] | None, metric: MetricDef,
        args: GnocchiExtraArgs, scope_id: str | None,
    ) -> dict[str, list[Any]]:
        keys = label_keys(metric)
        rows = sample_rows(metric)
        for group in groups:
            labels = {k: _text(v) for k, v in group["group"].items()}
            scope = scope_id if scope_id is not None else labels.get(self._scope_key, "")
            value = group["measures"]["measures"]["aggregated"][0][2]
            if not scope or not math.isfinite(value):
                continue
            if resources is not None:
                resource = resources.get(labels.get(args.resource_key, ""))
                if resource is None:
                    LOG.warning("gnocchi: %s: no resource with %s=%s alive in the period: group skipped",
                                metric.key, args.resource_key, labels.get(args.resource_key))
                    continue
                labels.update({m: _text(resource.get(m)) for m in metric.metadata})
            rows[schema.SCOPE].append(scope)
            rows[VALUE].append(float(value))
            for k in keys:
                rows[k].append(labels.get(k, ""))
        return rows

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        self._client.close()
