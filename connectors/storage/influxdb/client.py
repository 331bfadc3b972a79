"""HTTP to InfluxDB: the v1 API and the v2 API.

v1 is ``/write`` and ``/query``; v2 is ``/api/v2/write``, Flux ``/api/v2/query`` and ``/api/v2/delete``.

Timeouts, retries (connection errors, timeouts, 429 and 5xx, with jittered backoff and
``Retry-After``; then ``RetriableConnectorError``: the frame is retried by the next run) and the
classification of refusals (401/403, other 4xx, TLS: ``FatalConnectorError`` with the server's
message) are ``connectors.http``'s.  Retrying a write is safe: a point rewritten with the same tag
set and time overwrites itself.

An InfluxQL answer is checked before the backend reads it (objects, lists and strings where
InfluxDB puts them): a malformed one — a proxy's error page, JSON nested too deep, a wrong type —
is a ``RetriableConnectorError`` saying what the server sent (its frames fail; the next run
tries again), never a ``KeyError`` or an ``AttributeError`` that would kill the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.http import HttpClient, HttpResponse, HttpSettings, parse_json
from ratebeam.connectors.storage.influxdb.config import InfluxConnection

#: First pause between two attempts (doubling, jittered).
_BACKOFF_START = 0.2


class InfluxHTTP:
    """One session to one server; ``close()`` releases it."""

    def __init__(self, connection: InfluxConnection) -> None:
        self.connection = connection
        headers, auth = {}, None
        if connection.version == 2:
            token = connection.token
            if token is None and connection.username is not None:
                token = f"{connection.username}:{connection.password or ''}"  # InfluxDB 1.8's v2 layer
            if token is not None:
                headers["Authorization"] = f"Token {token}"
        elif connection.username is not None:
            auth = (connection.username, connection.password or "")
        settings = HttpSettings(
            connection.url, "influxdb storage", connection.verify, connection.timeout, connection.retries, _BACKOFF_START
        )
        self._http = HttpClient(settings, auth=auth, headers=headers, explain=_explain)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def request(self, method: str, path: str, allow: tuple[int, ...] = (), **kwargs: Any) -> HttpResponse:
        """One call (retried by ``connectors.http``); a 2xx answer or one whose status is in ``allow``."""
        return self._http.request(method, path, allow=allow, **kwargs)

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
        response = self.request("POST", "/query", data=params)
        where = self._http.where("/query")
        for raw in response.content.splitlines():
            if not raw:
                continue
            document = _document(raw, where)
            if "error" in document:
                raise FatalConnectorError(f"{self._http.where('/query')}: query failed: {document['error']}")
            for result in document.get("results", []):
                if "error" in result:
                    raise FatalConnectorError(
                        f"{self._http.where('/query')}: query failed: {result['error']} (in: {statements[:300]})"
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
            allow=(404,),
            params={"bucket": c.bucket, "org": c.org},
            json={"start": start, "stop": stop, "predicate": predicate},
        )
        if response.status != 404:
            return True
        if response.headers.get("Content-Type", "").startswith("application/json"):
            raise FatalConnectorError(f"{self._http.where('/api/v2/delete')}: {response.text[:500]}")
        return False


def _document(raw: bytes, where: str) -> dict[str, Any]:
    """One line of a chunked InfluxQL answer, checked (``RetriableConnectorError`` saying what is wrong)."""
    try:
        document = parse_json(raw)
    except ValueError as exc:
        raise RetriableConnectorError(f"{where}: the answer is {exc}") from None
    problem = _problem(document)
    if problem:
        shown = raw[:200].decode("utf-8", errors="replace")
        raise RetriableConnectorError(f"{where}: malformed InfluxQL answer ({problem}): {shown!r}")
    return document


def _problem(document: Any) -> str:
    """What is wrong with an InfluxQL answer's shape ('' when nothing): the keys the backend reads."""
    if not isinstance(document, dict):
        return "not an object"
    results = document.get("results", [])
    if not isinstance(results, list):
        return "'results' is not a list"
    for result in results:
        if not isinstance(result, dict):
            return "a result is not an object"
        if not isinstance(result.get("statement_id", 0), int):
            return "'statement_id' is not an integer"
        series = result.get("series", [])
        if not isinstance(series, list) or not all(isinstance(s, dict) for s in series):
            return "'series' is not a list of objects"
        for one in series:
            columns, values = one.get("columns", []), one.get("values", [])
            if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
                return "'columns' is not a list of strings"
            if not isinstance(values, list) or not all(isinstance(v, list) for v in values):
                return "'values' is not a list of rows"
            if values and not columns:
                return "rows without 'columns'"
            if any(len(row) != len(columns) for row in values):
                return "a row does not have one value per column"
    return ""


def _explain(response: HttpResponse) -> str:
    """The server's ``error`` (JSON) or the start of its text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("error" in body or "message" in body):
        return str(body.get("error") or body.get("message"))[:500]
    return response.text[:500]
