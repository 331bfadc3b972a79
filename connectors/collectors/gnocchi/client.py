"""A small Gnocchi v1 API client shared by the Gnocchi collector and fetcher.

The HTTP policy (deadline, retries of 5xx/429/connection errors with jittered backoff, TLS, no
redirects, credentials out of messages) is ``connectors.http``'s: 401/403 stop the run there.  Here,
what Gnocchi's answers mean:

* the aggregates API answers 404 ``Metric [...] does not exist`` when no resource of the search has
  the metric — CloudKitty's "no data" (``collector/gnocchi.py:330-343``), so ``aggregates`` returns
  ``[]``; any other 404 (``Metrics with unknown aggregation``: the archive policy lacks the method)
  and every 400 (an unknown resource type, a bad operation) come from the configuration and can never
  succeed: ``GnocchiRefused``, fatal;
* an answer that is not the documented JSON shape is ``GnocchiAnswerError`` (skippable: that frame
  fails, naming what is wrong), never a ``KeyError``.

Requests carry ``Accept: application/json`` so that Gnocchi's errors come as JSON and their
``description`` is what messages quote.  Searches are JSON bodies built as data
(``collectors.gnocchi.query``); nothing a user or a server wrote is pasted into a query text.
Basic auth is Gnocchi's ``auth_mode = basic`` (the user name is the identity; the password is sent
if one is configured, for a proxy in front of Gnocchi).  Its ``auth_mode = keystone`` reuses the
Keystone fetcher's session (``fetchers.keystone.session``: keystoneauth's token, re-used and
refreshed, sent by the ``KeystoneToken`` hook; a refused password is one fatal message), and Gnocchi
is the catalog's ``metric`` endpoint unless ``url`` is given — looked up at the first request, not
when the client is built, so a Keystone outage fails frames like any other transient error.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests

from ratebeam.connectors.errors import FatalConnectorError, SkippableConnectorError
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.http import HttpClient, HttpResponse, HttpSettings, full_jitter, tls_verify

if TYPE_CHECKING:
    from ratebeam.connectors.fetchers.keystone.session import KeystoneSession

#: Resources per search page (Gnocchi's default ``max_limit``).
PAGE = 1000
#: The catalog's service type of Gnocchi (CloudKitty's ``collector/gnocchi.py``, gnocchiclient's).
SERVICE_TYPE = "metric"
_NO_METRIC = "does not exist"


@dataclass(frozen=True)
class GnocchiConnection:
    """Where and how to reach Gnocchi; ``url`` is its root (``http://gnocchi:8041``, ``/v1`` is added).

    With ``keystone`` (Gnocchi's ``auth_mode = keystone``) a missing ``url`` is the catalog's
    ``metric`` endpoint of ``interface`` (and ``region_name``, if given).
    """

    url: str | None
    username: str | None = None
    password: str | None = None
    cafile: str | None = None
    insecure: bool = False
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5
    keystone: KeystoneCredentials | None = None
    interface: str = "internal"
    region_name: str | None = None

    def __repr__(self) -> str:  # never print secrets in logs or failure reasons
        return (f"GnocchiConnection(url={self.url!r}, keystone={self.keystone!r}, timeout={self.timeout}, "
                f"retries={self.retries})")

    def http_settings(self, url: str) -> HttpSettings:
        """``connectors.http``'s settings for Gnocchi's root ``url`` (TLS: off, ``cafile`` or the system CAs)."""
        return HttpSettings(url.rstrip("/") + "/v1", "gnocchi", tls_verify(self.insecure, self.cafile), self.timeout, self.retries, self.backoff)


class GnocchiRefused(FatalConnectorError):
    """Gnocchi refused a request built from the configuration: no later request can succeed."""


class GnocchiAnswerError(SkippableConnectorError):
    """Gnocchi answered something that is not the documented JSON: that frame fails."""


def _description(response: HttpResponse) -> str:
    """Gnocchi's error ``description`` (JSON when asked for it), else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and "description" in body:
        return str(body["description"])[:300]
    return response.text[:300]


class GnocchiClient:
    """The two calls ratebeam needs: the aggregates API and a paginated resource search."""

    def __init__(
        self, connection: GnocchiConnection, sleep: Callable[[float], None] = _time.sleep,
        jitter: Callable[[float], float] = full_jitter,
    ) -> None:
        self._connection, self._sleep, self._jitter = connection, sleep, jitter
        self._client: HttpClient | None = None
        self._keystone: KeystoneSession | None = None
        if connection.keystone is not None:  # the optional ``openstack`` extra: imported when used
            from ratebeam.connectors.fetchers.keystone.session import KeystoneSession

            self._keystone = KeystoneSession(connection.keystone)

    @property
    def requests(self) -> int:
        """HTTP attempts to Gnocchi made so far (retries included; token requests not)."""
        return self._client.attempts if self._client is not None else 0

    @property
    def _http(self) -> HttpClient:
        """The HTTP client on Gnocchi, built at the first request (that may need the catalog)."""
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _connect(self) -> HttpClient:
        connection, url = self._connection, self._connection.url
        auth: tuple[str, str] | requests.auth.AuthBase | None = None
        if self._keystone is not None:
            from ratebeam.connectors.fetchers.keystone.session import KeystoneToken

            auth = KeystoneToken(self._keystone)
            url = url or self._keystone.endpoint(SERVICE_TYPE, connection.interface, connection.region_name)
        elif connection.username is not None:
            auth = (connection.username, connection.password or "")
        if url is None:  # the configuration requires url without keystone: never happens
            raise FatalConnectorError("gnocchi: no url and no keystone section to find it in")
        return HttpClient(
            connection.http_settings(url), auth=auth, headers={"Accept": "application/json"}, explain=_description,
            sleep=self._sleep, jitter=self._jitter,
        )

    def aggregates(
        self, operations: list[Any] | str, resource_type: str, search: dict[str, Any], groupby: Sequence[str],
        start: datetime, stop: datetime, granularity: int | None,
    ) -> list[dict[str, Any]]:
        """The groups of ``POST /v1/aggregates`` as CloudKitty asks for them (``use_history``, no details).

        Each group is checked: ``{"group": {...}, "measures": {"measures": {"aggregated": [[t, g, v], ...]}}}``.
        """
        params: list[tuple[str, Any]] = [("details", "false"), ("start", start.isoformat()),
                                         ("stop", stop.isoformat()), ("use_history", "true")]
        params += [("groupby", key) for key in groupby]
        if granularity:
            params.append(("granularity", granularity))
        body = {"operations": operations, "search": search, "resource_type": resource_type}
        response = self._http.request("POST", "/aggregates", params=params, json=body, allow=(400, 404))
        if response.status == 404 and _NO_METRIC in _description(response):
            return []
        if response.status in (400, 404):
            raise GnocchiRefused(f"{self._http.where('/aggregates')}: HTTP {response.status}: "
                                 f"{_description(response)} (resource type {resource_type!r}, operations {operations})")
        return [_checked_group(group, groupby) for group in self._json(response, "/aggregates", list)]

    def search(self, resource_type: str, query: dict[str, Any], sorts: str = "id:asc") -> Iterator[dict[str, Any]]:
        """Every resource of ``POST /v1/search/resource/<type>`` matching ``query``, page by page (``marker``)."""
        marker = None
        while True:
            page = self.page(resource_type, query, sorts=sorts, marker=marker)
            yield from page
            if len(page) < PAGE:
                return
            marker = page[-1]["id"]

    def page(
        self, resource_type: str, query: dict[str, Any], *, sorts: str = "id:asc", marker: str | None = None,
        details: bool = False,
    ) -> list[dict[str, Any]]:
        """One page (``PAGE`` resources at most) of a resource search, after ``marker`` (a resource id)."""
        path = f"/search/resource/{resource_type}"
        params: dict[str, Any] = {"limit": PAGE, "sorts": sorts, "details": "true" if details else "false"}
        if marker is not None:
            params["marker"] = marker
        response = self._http.request("POST", path, params=params, json=query, allow=(400, 404))
        if response.status in (400, 404):
            raise GnocchiRefused(f"{self._http.where(path)}: HTTP {response.status}: {_description(response)}")
        page = self._json(response, path, list)
        for resource in page:
            if not isinstance(resource, dict) or not isinstance(resource.get("id"), str):
                raise GnocchiAnswerError(f"{self._http.where(path)}: a resource without an id: {str(resource)[:200]}")
        return page

    def _json(self, response: HttpResponse, path: str, kind: type) -> Any:
        try:
            body = response.json()
        except ValueError as exc:
            raise GnocchiAnswerError(f"{self._http.where(path)}: {exc}") from None
        if not isinstance(body, kind):
            raise GnocchiAnswerError(f"{self._http.where(path)}: expected a JSON {kind.__name__}: {response.text[:200]}")
        return body

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        if self._client is not None:
            self._client.close()


def _checked_group(group: Any, groupby: Sequence[str]) -> dict[str, Any]:
    """``group`` if it has the shape of the module docstring, else ``GnocchiAnswerError`` quoting it."""
    keys = group.get("group") if isinstance(group, dict) else None
    measures = group.get("measures") if isinstance(group, dict) else None
    inner = measures.get("measures") if isinstance(measures, dict) else None
    aggregated = inner.get("aggregated") if isinstance(inner, dict) else None
    if not isinstance(keys, dict) or not isinstance(aggregated, list) or not all(k in keys for k in groupby):
        raise GnocchiAnswerError(f"gnocchi: unexpected aggregates group: {str(group)[:200]}")
    for item in aggregated:
        if (not isinstance(item, list) or len(item) != 3 or isinstance(item[2], bool)
                or not isinstance(item[2], int | float)):
            raise GnocchiAnswerError(f"gnocchi: unexpected aggregate {str(item)[:100]} in group {str(keys)[:200]}")
    return group
