"""A Keystone v3 session for the OpenStack connectors (Keystone fetcher, Aetos collector).

Why keystoneauth1 for the token only: keystoneauth does what every OpenStack client does with a token
— password or application-credential authentication, re-use of the token until it is about to
expire (``MIN_TOKEN_LIFE_SECONDS``) and a new one then, the service catalog — but the API calls
themselves go through ``connectors.http`` (``KeystoneToken`` is a ``requests`` auth hook that sets
``X-Auth-Token``), so they get the project's deadline, retry, TLS and message policy like every other
connector.  Each request is retried in exactly one layer: the API calls by ``connectors.http``, the
token requests by keystoneauth (``_RetryingSession``: connection failures, 429 and 5xx, with its own
exponential backoff); a token failure raised inside the hook is a ``ConnectorError``, which
``connectors.http`` does not retry again.

Keystone's answers are classified by the taxonomy (``connectors.errors``): a refused password or
application credential (401), a forbidden scope (403), an unverifiable certificate, an unknown
endpoint or a malformed catalog are fatal (the run stops with one line); Keystone down or
answering 5xx after the retries is retriable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import requests
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import session as ks_session

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.http import is_retried_status, parse_json, redact
from ratebeam.connectors.http_deadline import BoundedSession

#: Statuses keystoneauth retries on a token request (it retries none of them by default).
RETRIED_STATUSES = [429, 500, 502, 503, 504]
_T = TypeVar("_T")


class _RetryingSession(ks_session.Session):
    """keystoneauth's session retrying connection failures, 429 and 5xx of its own (token) requests.

    It follows no redirect: keystoneauth would repeat a 307's POST, password in its body, to
    whatever host the ``Location`` names; a redirect is fatal instead, as in ``connectors.http``.
    Its ``timeout`` bounds each request as a whole (``BoundedSession``), not each read: a Keystone
    trickling its token answer a byte at a time is cut off, as every other server is.
    """

    def __init__(self, retries: int, backoff: float, **kwargs: Any) -> None:
        super().__init__(connect_retries=retries, redirect=False, session=BoundedSession(), **kwargs)
        self._retries, self._backoff = retries, backoff
        #: The last answer Keystone gave: what to quote when keystoneauth cannot read it.
        self.last: requests.Response | None = None

    # keystoneauth's signature lists every option; only the retry ones are defaulted here.
    def request(self, url: str, method: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("connect_retry_delay", self._backoff)
        if not kwargs.get("status_code_retries"):
            kwargs["status_code_retries"] = self._retries
            kwargs.setdefault("retriable_status_codes", RETRIED_STATUSES)
            kwargs.setdefault("status_code_retry_delay", self._backoff)
        self.last = None
        self.last = super().request(url, method, **kwargs)
        if 300 <= self.last.status_code < 400:
            raise FatalConnectorError(
                f"keystone {redact(url)}: redirected to {redact(self.last.headers.get('Location', '(nowhere)'))} "
                f"(HTTP {self.last.status_code}); redirects are not followed")
        return self.last


class KeystoneSession:
    """One authenticated keystoneauth session: the token, the user id and catalog endpoints."""

    def __init__(self, credentials: KeystoneCredentials) -> None:
        self.credentials = credentials
        self._session = _RetryingSession(
            credentials.retries, credentials.backoff, auth=credentials.plugin(), verify=credentials.verify,
            cert=credentials.cert, timeout=credentials.timeout,
        )

    def token(self) -> str:
        """A valid token: the current one, or a new one when it expires within two minutes."""
        token = self._classified(self._session.get_token)
        if not token:
            raise FatalConnectorError(f"keystone {self.credentials.url}: authentication gave no token")
        return token

    def user_id(self) -> str:
        """The id of the authenticated (rating) user, read from the token."""
        return str(self._classified(self._session.get_user_id))

    def endpoint(self, service_type: str, interface: str, region_name: str | None) -> str:
        """The catalog's URL of ``service_type`` (as CloudKitty's Aetos client finds Aetos)."""
        url = self._classified(lambda: self._session.get_endpoint(
            service_type=service_type, interface=interface, region_name=region_name))
        if not url:
            where = f"interface {interface}" + (f", region {region_name}" if region_name else "")
            raise FatalConnectorError(
                f"keystone {self.credentials.url}: no {service_type} endpoint in the catalog ({where})")
        return str(url)

    def invalidate(self) -> None:
        """Forget the token (the next ``token()`` authenticates again)."""
        self._session.invalidate()

    def _classified(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        # keystoneauth reads the token answer itself: JSON that is no token object is its
        # InvalidResponse, but ``null`` is a TypeError there and deep nesting a RecursionError
        except (ks_exceptions.InvalidResponse, RecursionError, TypeError, AttributeError, KeyError):
            raise self._unreadable() from None
        except ks_exceptions.ClientException as exc:
            raise classify(self.credentials.url, exc) from None

    def _unreadable(self) -> FatalConnectorError:
        """Keystone's answer was no token: fatal, saying what it sent (``self._session.last``)."""
        where = f"keystone {redact(self.credentials.url)}: the authentication answer is not a Keystone token"
        answer = self._session.last
        if answer is None:
            return FatalConnectorError(where)
        try:
            body = parse_json(answer.content)
        except ValueError as exc:
            return FatalConnectorError(f"{where} (HTTP {answer.status_code}): {exc}")
        return FatalConnectorError(f"{where} (HTTP {answer.status_code}): no 'token' object in {str(body)[:200]}")


def classify(url: str, exc: ks_exceptions.ClientException) -> FatalConnectorError | RetriableConnectorError:
    """The taxonomy's error for a keystoneauth failure (see the module docstring)."""
    where = f"keystone {redact(url)}"
    if isinstance(exc, ks_exceptions.SSLError):
        return FatalConnectorError(f"{where}: TLS: {exc}")
    if isinstance(exc, ks_exceptions.Unauthorized):
        return FatalConnectorError(f"{where}: authentication refused: HTTP 401: {exc.message}")
    if isinstance(exc, ks_exceptions.HttpError) and is_retried_status(exc.http_status or 0):
        return RetriableConnectorError(f"{where}: HTTP {exc.http_status}: {exc.message} (after retries)")
    if isinstance(exc, ks_exceptions.HttpError):
        return FatalConnectorError(f"{where}: HTTP {exc.http_status}: {exc.message}")
    if isinstance(exc, ks_exceptions.ConnectionError | ks_exceptions.RetriableConnectionFailure):
        return RetriableConnectorError(f"{where}: {exc} (after retries)")
    return FatalConnectorError(f"{where}: {exc}")


class KeystoneToken(requests.auth.AuthBase):
    """``requests`` auth hook: each request carries a valid token of ``keystone`` (``X-Auth-Token``)."""

    def __init__(self, keystone: KeystoneSession) -> None:
        self.keystone = keystone

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        """Set the token header (authenticating first when there is no valid token)."""
        request.headers["X-Auth-Token"] = self.keystone.token()
        return request
