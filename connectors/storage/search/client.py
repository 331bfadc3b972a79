"""Plain HTTP to an Elasticsearch or OpenSearch node, on ``connectors.http``.

No official client: the Elasticsearch client refuses servers that are not Elastic and the OpenSearch
one adds nothing the few endpoints used here need (``_bulk``, ``_search``, mappings).  Timeouts,
retries (connection errors, timeouts, 429, 5xx; then ``RetriableConnectorError``: the pipeline
retries the frame later) and refusals (any other 4xx, TLS: ``FatalConnectorError`` quoting the
server's reason) are the HTTP layer's; this module adds JSON bodies and the engines' error format.
"""

from __future__ import annotations

import json
from typing import Any

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.http import HttpClient, HttpResponse, HttpSettings


class SearchHttp:
    """A session on one node URL; ``request`` returns the status and the decoded JSON body."""

    def __init__(
        self,
        url: str,
        name: str,
        verify: bool | str = True,
        timeout: float = 60.0,
        attempts: int = 5,
        base_delay: float = 0.5,
    ) -> None:
        self.name = name
        settings = HttpSettings(url, f"{name} storage", verify, timeout, attempts - 1, base_delay)
        self._http = HttpClient(settings, explain=_reason)

    def close(self) -> None:
        """Close the pooled connections."""
        self._http.close()

    def where(self, path: str = "") -> str:
        """``<engine> storage <url><path>`` for messages."""
        return self._http.where(path)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ndjson: str | None = None,
        params: dict[str, Any] | None = None,
        allow: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """``(status, json body)``; statuses in ``allow`` are returned instead of raised.

        A successful answer that is not a JSON object (a proxy's page, ``null``, JSON nested too
        deeply) is ``RetriableConnectorError`` saying what came: the frame fails, nothing reads it.
        """
        data: bytes | None
        if ndjson is not None:
            data, content_type = ndjson.encode(), "application/x-ndjson"
        else:
            data = None if body is None else json.dumps(body).encode()
            content_type = "application/json"
        response = self._http.request(
            method, path, data=data, params=params, headers={"Content-Type": content_type},
            allow=allow, timeout=timeout,
        )
        if response.status < 300 and response.content:
            try:
                body = response.json()
            except ValueError as exc:
                raise RetriableConnectorError(f"{self.where(path)}: {exc}") from None
            if not isinstance(body, dict):
                raise RetriableConnectorError(
                    f"{self.where(path)}: malformed answer (not a JSON object): {json.dumps(body)[:200]}")
            return response.status, body
        return response.status, _json(response)


def _json(response: HttpResponse) -> Any:
    """The reply's JSON; a body that is not JSON as ``{"text", "error"}`` (error messages quote them)."""
    if not response.content:
        return {}
    try:
        return response.json()
    except ValueError as exc:
        return {"text": response.text[:500], "error": str(exc)}


def _reason(response: HttpResponse) -> str:
    """The server's error type and reason, short (whatever the shape of the body)."""
    body = _json(response)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        causes = error.get("root_cause")
        cause = causes[0] if isinstance(causes, list) and causes and isinstance(causes[0], dict) else error
        return f"{cause.get('type')}: {cause.get('reason')}"
    return str(error or body)[:500]
