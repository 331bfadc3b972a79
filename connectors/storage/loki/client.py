"""Loki's HTTP API (push, query_range, delete) on ``connectors.http``.

No client library: the three endpoints are plain HTTP.  Timeouts, retries (connection errors,
timeouts, 429 — Loki's rate limit — and 5xx, with jitter and ``Retry-After``), TLS and credential
redaction are the HTTP layer's.  A push Loki refuses as bad data (400: line too long, entry too
old, invalid labels) fails the frame (``SkippableConnectorError``); 401/403 stop the run.  The
tenant goes in ``X-Scope-OrgID``, a bearer token in ``Authorization``; neither is ever in a message.
"""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from typing import Any

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.http import HttpClient, HttpResponse, HttpSettings
from ratebeam.connectors.storage.loki.config import LokiStorageConfig


class LokiHttp:
    """A session on one Loki API base URL (``…/loki/api/v1``) for one tenant."""

    def __init__(self, options: LokiStorageConfig) -> None:
        headers = {}
        if options.tenant is not None:
            headers["X-Scope-OrgID"] = options.tenant
        if options.bearer_token is not None:
            headers["Authorization"] = f"Bearer {options.bearer_token}"
        auth = (options.username, options.password or "") if options.username is not None else None
        settings = HttpSettings(options.url, "loki storage", options.verify, options.timeout, options.retries)
        self._http = HttpClient(settings, auth=auth, headers=headers, explain=_reason)
        self._gzip = options.compression == "gzip"

    def close(self) -> None:
        """Close the pooled connections."""
        self._http.close()

    def where(self, path: str = "") -> str:
        """``loki storage <url><path>`` for messages."""
        return self._http.where(path)

    def push(self, body: bytes) -> None:
        """POST one JSON push body (gzip-compressed unless configured otherwise); Loki answers 204."""
        headers = {"Content-Type": "application/json"}
        if self._gzip:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        self._http.request("POST", "/push", data=body, headers=headers, frame_errors=(400, 413))

    def query_range(self, query: str, start_ns: int, end_ns: int, limit: int) -> list[dict[str, Any]]:
        """The ``data.result`` streams of a log query over ``[start_ns, end_ns)``, oldest first."""
        params = {"query": query, "start": str(start_ns), "end": str(end_ns), "limit": str(limit), "direction": "forward"}
        answer = _json(self._http.request("GET", "/query_range", params=params), self.where("/query_range"))
        problem = _streams_problem(answer)
        if problem:
            raise RetriableConnectorError(f"{self.where('/query_range')}: unexpected answer ({problem}): "
                                          f"{str(answer)[:300]}")
        return answer["data"]["result"] or []

    def delete(self, query: str, start_ns: int | None, last_ns: int | None) -> None:
        """One delete request of entries in ``[start_ns, last_ns]`` (None: Loki's default, epoch / now).

        Loki answers 204 and applies the request asynchronously (see docs/loki.md).
        """
        params = {"query": query}
        if start_ns is not None:
            params["start"] = rfc3339(start_ns)
        if last_ns is not None:
            params["end"] = rfc3339(last_ns)
        self._http.request("POST", "/delete", params=params)


def rfc3339(ns: int) -> str:
    """Nanoseconds since the epoch as RFC 3339 with nanoseconds (Go's ``time.RFC3339Nano``)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}Z"


def _json(response: HttpResponse, where: str) -> dict[str, Any]:
    """The answer's JSON; one that is not JSON (a proxy's page, a broken body) fails like any bad answer."""
    try:
        return response.json()
    except ValueError as exc:  # parse_json's reason quotes the start of the body
        raise RetriableConnectorError(f"{where}: not a Loki API answer: {exc}") from None


def _streams_problem(answer: Any) -> str:
    """What is wrong with a ``query_range`` answer's shape ('' when nothing): what the reader indexes.

    A proxy or a server that is not Loki must fail the command or frame saying what it sent, never
    with a ``KeyError`` or ``AttributeError`` from inside the line decoder.
    """
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict) or answer.get("status") != "success" or data.get("resultType") != "streams":
        return "not a successful streams answer"
    result = data.get("result") or []
    if not isinstance(result, list):
        return "data.result is not a list"
    for stream in result:
        if not isinstance(stream, dict) or not isinstance(stream.get("stream"), dict):
            return "a stream without its labels"
        values = stream.get("values")
        if not isinstance(values, list) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in values):
            return "a stream whose values are not [timestamp, line] pairs"
    return ""


def _reason(response: HttpResponse) -> str:
    """Loki's error text (plain text, or a JSON ``message``), short."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300]
    return str(body.get("message") or body.get("error") or body)[:300] if isinstance(body, dict) else str(body)[:300]
