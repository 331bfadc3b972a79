"""Plain HTTP to an Elasticsearch or OpenSearch node: timeouts, retries, errors as connector errors.

No official client: the Elasticsearch client refuses servers that are not Elastic and the OpenSearch
one adds nothing the few endpoints used here need (``_bulk``, ``_search``, ``_delete_by_query``,
mappings).  Every request has a timeout; connection errors, timeouts, 429 and 5xx answers are
retried with exponential backoff (then ``RetriableConnectorError``: the pipeline retries the frame
later); any other 4xx is a ``FatalConnectorError`` quoting the server's reason.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import requests

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError

LOG = logging.getLogger(__name__)

#: Answers worth retrying: overloaded (429) or a server-side failure.
RETRIABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class SearchHttp:
    """A session on one node URL; ``request`` returns the decoded JSON body."""

    def __init__(
        self,
        url: str,
        name: str,
        verify: bool | str = True,
        timeout: float = 60.0,
        attempts: int = 5,
        base_delay: float = 0.5,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = name
        self.timeout = timeout
        self.attempts = attempts
        self.base_delay = base_delay
        self._session = requests.Session()
        self._session.verify = verify

    def close(self) -> None:
        """Close the pooled connections."""
        self._session.close()

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
        """``(status, json body)``; statuses in ``allow`` are returned instead of raised."""
        if ndjson is not None:
            data, content_type = ndjson.encode(), "application/x-ndjson"
        else:
            data = None if body is None else json.dumps(body).encode()
            content_type = "application/json"
        what = f"{self.name} storage: {method} {path}"
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._session.request(
                    method,
                    self.url + path,
                    data=data,
                    params=params,
                    headers={"Content-Type": content_type},
                    timeout=timeout or self.timeout,
                )
            except requests.RequestException as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status < 300 or status in allow:
                    return status, _json(response)
                reason = f"HTTP {status}: {_reason(response)}"
                if status not in RETRIABLE_STATUSES:
                    raise FatalConnectorError(f"{what}: {reason}")
            if attempt < self.attempts:
                delay = self.base_delay * 2 ** (attempt - 1)
                LOG.warning("%s failed (%s); retry %d/%d in %.1fs", what, reason, attempt, self.attempts - 1, delay)
                time.sleep(delay)
        raise RetriableConnectorError(f"{what}: {reason} (after {self.attempts} attempts)")


def _json(response: requests.Response) -> dict[str, Any]:
    if not response.content:
        return {}
    try:
        return response.json()
    except ValueError:
        return {"text": response.text[:500]}


def _reason(response: requests.Response) -> str:
    """The server's error type and reason, short."""
    body = _json(response)
    error = body.get("error")
    if isinstance(error, dict):
        cause = (error.get("root_cause") or [error])[0]
        return f"{cause.get('type')}: {cause.get('reason')}"
    return str(error or body)[:500]
