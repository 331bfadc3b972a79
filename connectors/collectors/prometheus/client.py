"""A small Prometheus HTTP API client shared by the Prometheus collector and fetcher.

The HTTP policy (timeout on the whole request, bounded retries with jittered backoff and
``Retry-After``, TLS verified by default, redirects refused, credentials kept out of messages) is
``connectors.http``'s.  Here, what Prometheus' answers mean: a query it refuses (HTTP 400/422, or
``status: error``) or an answer that is not an instant vector is ``PrometheusQueryRefused`` —
skippable: that frame fails, the run goes on; refused credentials or a TLS failure are
``PrometheusAccessError`` — fatal: the run stops.  Both carry the query.  Every series of an answer
is checked before anyone reads it (an object with a ``metric`` object of string labels and a
``value`` pair whose sample is a string, as Prometheus' API documents): a malformed one refuses
the query naming what is wrong and quoting the series, never as ``KeyError: 'value'``.  Basic auth (also from
``user:password@`` in the URL), a bearer token, or any ``requests`` auth hook (the Aetos collector's
Keystone token).

Each HTTP attempt increments the Beam counter ``ratebeam/prometheus_requests`` (a no-op outside a
pipeline) and the client's own ``requests`` attribute.
"""

from __future__ import annotations

import json
import time as _time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ratebeam.connectors.errors import (
    ConnectorError,
    FatalConnectorError,
    RetriableConnectorError,
    SkippableConnectorError,
)
from ratebeam.connectors.http import HttpClient, HttpResponse, HttpSettings, full_jitter, tls_verify

if TYPE_CHECKING:
    from requests.auth import AuthBase


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

    def http_settings(self) -> HttpSettings:
        """The settings of ``connectors.http`` (TLS: ``insecure`` off, ``cafile``, or the system CAs)."""
        return HttpSettings(self.url, "prometheus", tls_verify(self.insecure, self.cafile), self.timeout, self.retries, self.backoff)


class PrometheusQueryError(ConnectorError):
    """Base of the errors that carry the query they are about."""

    def __init__(self, query: str, message: str) -> None:
        super().__init__(f"{message}; query: {query}")
        self.query = query
        self.message = message


class PrometheusQueryRefused(PrometheusQueryError, SkippableConnectorError):
    """Prometheus refused a query or answered nonsense: that frame fails, retrying cannot help."""


class PrometheusAccessError(PrometheusQueryError, FatalConnectorError):
    """Credentials or TLS refused: no query can succeed, the run stops."""


class PrometheusClient:
    """Instant queries against one Prometheus; built on workers (holds a ``requests.Session``).

    ``auth`` (a ``requests`` auth hook), ``cert`` (a TLS client certificate) and ``backend`` (the
    name in messages) serve a Prometheus API behind another front, as Aetos is.
    """

    def __init__(
        self,
        connection: PrometheusConnection,
        sleep: Callable[[float], None] = _time.sleep,
        jitter: Callable[[float], float] = full_jitter,
        *,
        auth: AuthBase | None = None,
        cert: str | tuple[str, str] | None = None,
        backend: str = "prometheus",
    ) -> None:
        headers = {"Authorization": f"Bearer {connection.bearer_token}"} if connection.bearer_token else None
        basic = None
        if connection.username is not None and connection.password is not None:
            basic = (connection.username, connection.password)
        settings = replace(connection.http_settings(), backend=backend, cert=cert)
        self._http = HttpClient(
            settings, auth=auth or basic, headers=headers, explain=_explain,
            sleep=sleep, jitter=jitter,
        )

    @property
    def requests(self) -> int:
        """HTTP attempts made so far (retries included)."""
        return self._http.attempts

    def query(self, promql: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """``data.result`` of ``GET {url}/query?query=..[&time=<at, ISO-8601>]`` (an instant vector)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = at.isoformat()
        try:
            response = self._http.request("GET", "/query", params=params, frame_errors=(400, 422))
        except SkippableConnectorError as exc:
            raise PrometheusQueryRefused(promql, str(exc)) from None
        except FatalConnectorError as exc:
            raise PrometheusAccessError(promql, exc.reason) from None
        except RetriableConnectorError as exc:
            raise RetriableConnectorError(f"{exc}; query: {promql}") from None
        body = _decode(response, promql)
        data = body.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise PrometheusQueryRefused(promql, f"prometheus: malformed response (no data.result): {str(body)[:200]}")
        if data.get("resultType") not in (None, "vector"):
            raise PrometheusQueryRefused(promql, f"prometheus: expected an instant vector, got {data.get('resultType')}")
        for series in data["result"]:
            _check_series(series, promql)
        return data["result"]

    def close(self) -> None:
        """Close the HTTP session."""
        self._http.close()


def _json(response: HttpResponse) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _check_series(series: Any, promql: str) -> None:
    """Refuse a series that is not ``{"metric": {label: text}, "value": [time, text]}``."""
    problem = _series_problem(series)
    if problem:
        shown = json.dumps(series, default=str)[:200]
        raise PrometheusQueryRefused(promql, f"prometheus: malformed series ({problem}): {shown}")


def _series_problem(series: Any) -> str:
    if not isinstance(series, dict):
        return "not an object"
    labels = series.get("metric", {})
    if not isinstance(labels, dict):
        return "'metric' is not an object"
    for name, text in labels.items():
        if not isinstance(text, str):
            return f"label {name!r} is not a string"
    if "value" not in series:
        return "no 'value'"
    value = series["value"]
    if not isinstance(value, list) or len(value) != 2:
        return "'value' is not a [time, sample] pair"
    if not isinstance(value[1], str):
        return "the sample in 'value' is not a string"
    return ""


def _explain(response: HttpResponse) -> str:
    """Prometheus' own ``errorType: error`` when the body has them."""
    body = _json(response)
    if isinstance(body, dict) and "error" in body:
        return f"{body.get('errorType')}: {body.get('error')}"
    return response.text[:200]


def _decode(response: HttpResponse, promql: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise PrometheusQueryRefused(promql, f"prometheus: response is {exc}") from None
    if isinstance(body, dict) and body.get("status") == "error":
        raise PrometheusQueryRefused(
            promql, f"prometheus HTTP {response.status} {body.get('errorType')}: {body.get('error')}"
        )
    if not isinstance(body, dict):
        raise PrometheusQueryRefused(promql, f"prometheus: response is not a JSON object: {response.text[:200]!r}")
    return body
