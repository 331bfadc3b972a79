"""The ``prometheus`` fetcher: the scopes are the values of one label of one metric (`cloudkitty/fetcher/prometheus.py:79-148`).

Sends CloudKitty's ``max(<metric>{filters}) by (<scope_attribute>)`` as an instant query at the
cycle's *now* (CloudKitty sends no time, i.e. the server's now; ``run --now`` over past data must find
that data's scopes), filter values quoted as PromQL strings, and returns the distinct scope ids **sorted**
(CloudKitty's ``list(set(...))`` has no order; a sorted list makes runs reproducible).  Series without
the label are ignored, as in CloudKitty.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ratebeam.connectors.collectors.prometheus.client import PrometheusClient, PrometheusConnection
from ratebeam.connectors.collectors.prometheus.promql import fetch_query
from ratebeam.connectors.fetchers.base import Fetcher


class PrometheusFetcher(Fetcher):
    """Lists the scope ids found in Prometheus."""

    name = "prometheus"

    def __init__(
        self, connection: PrometheusConnection, metric: str, scope_attribute: str = "project_id",
        filters: Iterable[tuple[str, str]] = (), client: PrometheusClient | None = None,
    ) -> None:
        self._client = client or PrometheusClient(connection)
        self._scope_attribute = scope_attribute
        self._query = fetch_query(metric, scope_attribute, filters)

    @property
    def query(self) -> str:
        """The PromQL this fetcher sends."""
        return self._query

    def counts(self) -> dict[str, int]:
        """The HTTP attempts to Prometheus so far."""
        return {"prometheus_requests": self._client.requests}

    def scopes(self, at: datetime | None = None) -> list[str]:
        """The distinct values of the scope label among the query's series at ``at`` (None: now), sorted."""
        found: set[str] = set()
        for item in self._client.query(self._query, at):  # series checked by the client
            value = item.get("metric", {}).get(self._scope_attribute)
            if value:
                found.add(str(value))
        return sorted(found)

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        self._client.close()
