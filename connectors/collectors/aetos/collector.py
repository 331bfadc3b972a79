"""The ``aetos`` collector: the Prometheus collector's queries through Aetos, with a Keystone token.

CloudKitty's Aetos collector is its Prometheus collector with another client
(``collector/aetos.py``): the same PromQL (``collectors.prometheus.promql``, so scope ids stay
escaped), sent to Aetos' ``/api/v1/query`` with the token of a keystoneauth session; Aetos is found
in the catalog (service type ``metric-storage``) unless ``url`` is given.  Here too it *is* the
Prometheus collector (``PrometheusCollector``: the samples, the 9-digit rule, ``collect_all``) with
the Prometheus client given a Keystone token hook (``fetchers.keystone.session.KeystoneToken``).

What Aetos does with the query is its business: a token with ``admin`` on its project (or the
``service`` role), as CloudKitty's rating user has, is sent through unchanged; any other token's
query is rewritten to select only the series whose project label is the token's project, so a
scope of another project has no data.  The endpoint is looked up at the first query (not when the
collector is built), so a Keystone outage fails frames like any other transient error.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ratebeam.connectors.collectors.aetos.config import SERVICE_TYPE, AetosConnection
from ratebeam.connectors.collectors.prometheus.client import PrometheusClient, PrometheusConnection
from ratebeam.connectors.collectors.prometheus.collector import PrometheusCollector
from ratebeam.connectors.fetchers.keystone.session import KeystoneSession, KeystoneToken


class AetosClient:
    """A ``PrometheusClient`` on Aetos, built at the first query (that may need the catalog)."""

    def __init__(self, connection: AetosConnection, keystone: KeystoneSession | None = None) -> None:
        self.connection = connection
        self.keystone = keystone or KeystoneSession(connection.keystone)
        self._client: PrometheusClient | None = None

    @property
    def requests(self) -> int:
        """HTTP attempts to Aetos so far (retries included; token requests not)."""
        return self._client.requests if self._client is not None else 0

    def url(self) -> str:
        """Aetos' API URL: the configured one, or the catalog's ``metric-storage`` endpoint + ``/api/v1``."""
        if self.connection.url is not None:
            return self.connection.url
        found = self.keystone.endpoint(SERVICE_TYPE, self.connection.interface, self.connection.region_name)
        return found.rstrip("/") + "/api/v1"

    def query(self, promql: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """``PrometheusClient.query`` through Aetos."""
        if self._client is None:
            creds = self.connection.keystone
            prometheus = PrometheusConnection(self.url(), cafile=creds.cafile, insecure=creds.insecure,
                                              timeout=creds.timeout, retries=creds.retries, backoff=creds.backoff)
            self._client = PrometheusClient(prometheus, auth=KeystoneToken(self.keystone), cert=creds.cert,
                                            backend="aetos")
        return self._client.query(promql, at)

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        if self._client is not None:
            self._client.close()


class AetosCollector(PrometheusCollector):
    """The Prometheus collector reading through Aetos; see the module docstring."""

    name = "aetos"

    def __init__(self, connection: AetosConnection, scope_key: str = "project_id",
                 client: AetosClient | None = None) -> None:
        super().__init__(PrometheusConnection(connection.url or ""), scope_key,
                         client=client or AetosClient(connection))  # type: ignore[arg-type]  # same interface
