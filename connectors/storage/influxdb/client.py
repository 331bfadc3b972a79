"""HTTP to InfluxDB: the v1 API (``/write``, ``/query``) and the v2 API (``/api/v2/write``, Flux
``/api/v2/query``, ``/api/v2/delete``), with a timeout on every request and retries.

A request is retried with exponential backoff (0.2 s doubling, at most 10 s, ``Retry-After``
honoured) on connection errors, timeouts, 429 and 5xx; when retries are exhausted the error is a
``RetriableConnectorError`` (the frame is retried by the next run).  Other 4xx answers are
``FatalConnectorError`` with the server's message.  Retrying a write is safe: a point rewritten
with the same tag set and time overwrites itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import requests

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError

_BACKOFF_START = 0.2
_BACKOFF_MAX = 10.0


@dataclass(frozen=True)
class InfluxConnection:
    """Where and how to reach InfluxDB (``version`` 1: InfluxQL API; 2: the v2 API)."""

    url: str
    version: int = 1
    database: str = "cloudkitty"
    retention_policy: str = "autogen"
    username: str | None = None
    password: str | None = None
    token: str | None = None
    org: str = "openstack"
    bucket: str = "cloudkitty"
    timeout: float = 60.0
    #: TLS verification: True, False, or the path of a CA bundle.
    verify: bool | str = True
    retries: int = 5
    batch_lines: int = 5000


class InfluxHTTP:
    """One session to one server; ``close()`` releases it."""

    def __init__(self, connection: InfluxConnection) -> None:
        self.connection = connection
        self._session = requests.Session()
        self._session.verify = connection.verify
        if connection.version == 2:
            token = connection.token
            if token is None and connection.username is not None:
                token = f"{connection.username}:{connection.password or ''}"  # InfluxDB 1.8's v2 layer
            if token is not None:
                self._session.headers["Authorization"] = f"Token {token}"
        elif connection.username is not None:
            self._session.auth = (connection.username, connection.password or "")
        self._base = connection.url.rstrip("/")

    def close(self) -> None:
        self._session.close()

    def request(
        self, method: str, path: str, ok: tuple[int, ...] = (200, 204), **kwargs: Any
    ) -> requests.Response:
        """One call with retries; returns a response whose status is in ``ok``."""
        url = f"{self._base}{path}"
        delay = _BACKOFF_START
        for attempt in range(self.connection.retries + 1):
            last = attempt == self.connection.retries
            try:
                response = self._session.request(method, url, timeout=self.connection.timeout, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if last:
                    raise RetriableConnectorError(f"influxdb storage: {method} {url}: {exc}") from exc
            else:
                if response.status_code in ok:
                    return response
                retriable = response.status_code == 429 or response.status_code >= 500
                if not retriable or last:
                    error = FatalConnectorError if not retriable else RetriableConnectorError
                    raise error(
                        f"influxdb storage: {method} {url} answered {response.status_code}: {response.text[:500]}"
                    )
                retry_after = response.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    delay = max(delay, float(retry_after))
            time.sleep(min(delay, _BACKOFF_MAX))
            delay *= 2
        raise AssertionError("unreachable")

    # -- writes --------------------------------------------------------------------------------

    def write(self, body: bytes, precision: str) -> None:
        """Write one line-protocol body."""
        c = self.connection
        if c.version == 2:
            params = {"bucket": c.bucket, "org": c.org, "precision": precision}
            self.request("POST", "/api/v2/write", params=params, data=body)
        else:
            params = {"db": c.database, "rp": c.retention_policy, "precision": precision}
            self.request("POST", "/write", params=params, data=body)

    def database_and_rp(self) -> tuple[str, str]:
        """The InfluxQL database and retention policy (v2: the bucket ``db/rp`` of InfluxDB 1.8)."""
        c = self.connection
        if c.version == 2:
            database, _, policy = c.bucket.partition("/")
            return database, policy or "autogen"
        return c.database, c.retention_policy

    # -- InfluxQL ------------------------------------------------------------------------------

    def influxql(self, statements: str, database: bool = True) -> Iterator[dict[str, Any]]:
        """Results of ``statements`` (``;``-separated), one dict per statement chunk; errors raised."""
        params = {"q": statements, "epoch": "ns", "chunked": "true", "chunk_size": "10000"}
        if database:
            params["db"], params["rp"] = self.database_and_rp()
        response = self.request("POST", "/query", data=params, stream=True)
        for raw in response.iter_lines():
            if not raw:
                continue
            document = json.loads(raw)
            if "error" in document:
                raise FatalConnectorError(f"influxdb storage: query failed: {document['error']}")
            for result in document.get("results", []):
                if "error" in result:
                    raise FatalConnectorError(
                        f"influxdb storage: query failed: {result['error']} (in: {statements[:300]})"
                    )
                yield result

    # -- v2 API --------------------------------------------------------------------------------

    def flux(self, query: str) -> str:
        """The CSV (with ``#datatype`` annotations) a Flux query returns."""
        body = {"query": query, "type": "flux", "dialect": {"header": True, "annotations": ["datatype"]}}
        response = self.request(
            "POST",
            "/api/v2/query",
            params={"org": self.connection.org},
            json=body,
            headers={"Accept": "application/csv"},
        )
        return response.text

    def delete_v2(self, start: str, stop: str, predicate: str) -> bool:
        """``/api/v2/delete``; False when the server does not serve it.

        InfluxDB 1.8's v2 layer answers a plain-text 404 (no such route); InfluxDB 2.x answers a JSON
        404 for an unknown bucket, which is an error.
        """
        c = self.connection
        response = self.request(
            "POST",
            "/api/v2/delete",
            ok=(200, 204, 404),
            params={"bucket": c.bucket, "org": c.org},
            json={"start": start, "stop": stop, "predicate": predicate},
        )
        if response.status_code != 404:
            return True
        if response.headers.get("Content-Type", "").startswith("application/json"):
            raise FatalConnectorError(f"influxdb storage: delete: {response.text[:500]}")
        return False
