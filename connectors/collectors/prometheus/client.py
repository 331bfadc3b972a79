"""A small Prometheus HTTP API client shared by the Prometheus collector and fetcher.

Why not CloudKitty's: every request has a timeout, transient failures (connection errors, timeouts,
HTTP 429 and 5xx) are retried a bounded number of times with exponential backoff (``Retry-After``
honoured, capped at 30 s) and then raise ``RetriableConnectorError``; a TLS failure raises
``FatalConnectorError`` at once; a refused query (HTTP 4xx, or ``status: error``) raises
``PrometheusQueryError`` — non-retriable, carrying the query and the server's message — so one bad
frame fails cleanly instead of crashing or looping.  TLS is verified by default (``cafile`` for a
private CA, ``insecure`` to turn verification off).  Basic auth or a bearer token.

Each HTTP attempt increments the Beam counter ``ratebeam/prometheus_requests`` (a no-op outside a
pipeline) and the client's own ``requests`` attribute.
"""

from __future__ import annotations

import logging
import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
from apache_beam.metrics import Metrics

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError

LOG = logging.getLogger(__name__)
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class PrometheusConnection:
    """Where and how to reach Prometheus; ``url`` includes the API prefix (``http://h:9090/api/v1``)."""

    url: str
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    cafile: str | None = None
    insecure: bool = False
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5

    def __repr__(self) -> str:  # never print secrets in logs or failure reasons
        return f"PrometheusConnection(url={self.url!r}, timeout={self.timeout}, retries={self.retries})"


class PrometheusQueryError(FatalConnectorError):
    """Prometheus refused a query (HTTP 4xx or ``status: error``): retrying the same query cannot help."""

    def __init__(self, query: str, message: str) -> None:
        super().__init__(f"{message}; query: {query}")
        self.query = query
        self.message = message


class PrometheusClient:
    """Instant queries against one Prometheus; built on workers (holds a ``requests.Session``)."""

    def __init__(self, connection: PrometheusConnection, sleep: Callable[[float], None] = _time.sleep) -> None:
        self._conn = connection
        self._sleep = sleep
        self._session = requests.Session()
        if connection.username is not None and connection.password is not None:
            self._session.auth = (connection.username, connection.password)
        if connection.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {connection.bearer_token}"
        # passed with every request: a session-level ``verify`` loses to $REQUESTS_CA_BUNDLE in requests
        self._verify: bool | str = False if connection.insecure else (connection.cafile or True)
        self._counter = Metrics.counter("ratebeam", "prometheus_requests")
        self.requests = 0

    def query(self, promql: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """``data.result`` of ``GET {url}/query?query=..[&time=<at, ISO-8601>]`` (an instant vector)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = at.isoformat()
        body = self._get("query", params, promql)
        data = body.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise PrometheusQueryError(promql, f"prometheus: malformed response (no data.result): {str(body)[:200]}")
        if data.get("resultType") not in (None, "vector"):
            raise PrometheusQueryError(promql, f"prometheus: expected an instant vector, got {data.get('resultType')}")
        return data["result"]

    def _get(self, endpoint: str, params: dict[str, str], promql: str) -> dict[str, Any]:
        url = f"{self._conn.url.rstrip('/')}/{endpoint}"
        attempts = self._conn.retries + 1
        for attempt in range(attempts):
            self.requests += 1
            self._counter.inc()
            try:
                response = self._session.get(url, params=params, timeout=self._conn.timeout, verify=self._verify)
            except requests.exceptions.SSLError as exc:  # a certificate problem does not go away
                raise FatalConnectorError(f"prometheus {url}: TLS: {exc}") from None
            except (requests.ConnectionError, requests.Timeout) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                delay = self._delay(attempt, None)
            else:
                status = response.status_code
                if status == 429 or status >= 500:
                    reason = f"HTTP {status}: {response.text[:200]}"
                    delay = self._delay(attempt, response.headers.get("Retry-After"))
                else:
                    return self._decode(response, promql)
            if attempt + 1 < attempts:
                LOG.info("prometheus %s: %s; retry %d/%d in %.1fs", url, reason, attempt + 1, attempts - 1, delay)
                self._sleep(delay)
        raise RetriableConnectorError(f"prometheus {url}: {reason} (after {attempts} attempts); query: {promql}")

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = self._conn.backoff * 2**attempt
        if retry_after is not None and retry_after.strip().isdigit():
            delay = max(delay, float(retry_after))
        return min(delay, MAX_BACKOFF)

    @staticmethod
    def _decode(response: requests.Response, promql: str) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("status") == "error":
            raise PrometheusQueryError(
                promql, f"prometheus HTTP {response.status_code} {body.get('errorType')}: {body.get('error')}"
            )
        if response.status_code >= 400:
            raise PrometheusQueryError(promql, f"prometheus HTTP {response.status_code}: {response.text[:200]}")
        if not isinstance(body, dict):
            raise PrometheusQueryError(promql, f"prometheus: response is not JSON: {response.text[:200]!r}")
        return body

    def close(self) -> None:
        """Close the HTTP session."""
        self._session.close()
