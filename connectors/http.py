"""The one HTTP layer of every HTTP connector (Prometheus, InfluxDB, Elasticsearch/OpenSearch).

Why one layer: retries used to be nested (the writer retried what the client had already retried,
20 to 24 HTTP attempts for one failure), TLS failures were classified three different ways and no
loop added jitter.  Here, and only here:

* every request has a deadline that bounds the *whole* exchange (``connectors.http_deadline``: the
  socket is cut off when it passes), so a server trickling bytes — of its headers or of its body —
  cannot hold a worker forever;
* connection errors, timeouts, 429 and 5xx are retried at most ``retries`` times (never more than
  ``MAX_RETRIES``) with exponential backoff and full jitter (AWS's "full jitter": a uniform draw in
  ``[0, backoff * 2**n]``, capped), and ``Retry-After`` (seconds or HTTP-date) is honoured as a
  floor, capped too; after the last attempt the error is ``RetriableConnectorError``;
* a TLS failure is ``FatalConnectorError`` at once (a certificate does not fix itself), 401/403 too
  (authentication), and any other 4xx unless the caller declares that status a frame error
  (``SkippableConnectorError``, e.g. Prometheus refusing one query) or handles it (``allow``);
* redirects are never followed (a 3xx is fatal, naming where it pointed), so credentials are never
  sent to another host; configure the final URL;
* messages name the backend and the URL with any ``user:password@`` removed, never a header, and
  say what the server did in words (``broke off its answer: invalid chunked encoding``), not with
  the name of a Python exception; ``parse_json`` reads an answer's JSON the same way for every
  connector (a body nested too deep for Python is a ``ValueError`` saying so, not a ``RecursionError``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
import urllib3
from urllib3.util import Retry

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError, SkippableConnectorError
from ratebeam.connectors.http_deadline import Deadline, DeadlineAdapter

LOG = logging.getLogger(__name__)

#: Upper bound of ``retries`` whatever the configuration says.
MAX_RETRIES = 10
#: Upper bound of one pause between attempts, ``Retry-After`` included.
MAX_BACKOFF = 30.0
_CHUNK = 64 * 1024
_USERINFO = re.compile(r"(?<=//)[^/@\s]+@")


def tls_verify(insecure: bool, cafile: str | None) -> bool | str:
    """``requests``' ``verify`` of the TLS options every connector has: False, the CA bundle's path, or True."""
    return False if insecure else (cafile or True)


def is_retried_status(status: int) -> bool:
    """True for the answers worth another attempt: overloaded (429) or a server-side failure (5xx)."""
    return status == 429 or status >= 500


def redact(text: str) -> str:
    """``text`` with every ``scheme://user:password@`` reduced to ``scheme://``."""
    return _USERINFO.sub("", text)


def full_jitter(cap: float) -> float:
    """A pause drawn uniformly in ``[0, cap]``: concurrent clients do not retry in lockstep."""
    return random.uniform(0.0, cap)


@dataclass(frozen=True)
class HttpSettings:
    """How to reach one server: ``url`` is the base every request path is appended to."""

    url: str
    #: The backend's name in messages (``prometheus``, ``influxdb storage``, ...).
    backend: str
    #: TLS verification: True, False, or the path of a CA bundle.
    verify: bool | str = True
    #: Seconds the whole request (connect, answer, body) may take.
    timeout: float = 60.0
    retries: int = 3
    #: First backoff in seconds; doubles with every attempt.
    backoff: float = 0.5
    #: A TLS client certificate: a PEM file holding the key too, or ``(certfile, keyfile)``.
    cert: str | tuple[str, str] | None = None


@dataclass(frozen=True)
class HttpResponse:
    """A complete answer (the body is read within the deadline)."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body as UTF-8 text (undecodable bytes replaced: error messages must never fail)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The decoded JSON body; ``ValueError`` (saying what is wrong) if it is not JSON."""
        return parse_json(self.content)


def parse_json(content: bytes | str) -> Any:
    """A server's JSON; ``ValueError`` saying what is wrong with it, an excerpt included."""
    try:
        return json.loads(content)
    except RecursionError:
        raise ValueError("JSON nested too deeply to be read") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        text = content.decode("utf-8", errors="replace") if isinstance(content, bytes) else content
        raise ValueError(f"not JSON ({exc}): {text[:200]!r}") from None


class _DeadlineExceeded(Exception):
    """The server answered too slowly as a whole (e.g. trickling the body)."""


class HttpClient:
    """A ``requests.Session`` on one server with the policy of the module docstring.

    ``sleep`` and ``jitter`` are injectable so tests observe the pauses without waiting;
    ``attempts`` counts every HTTP attempt.
    """

    def __init__(
        self,
        settings: HttpSettings,
        *,
        auth: tuple[str, str] | requests.auth.AuthBase | None = None,
        headers: Mapping[str, str] | None = None,
        explain: Callable[[HttpResponse], str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[float], float] = full_jitter,
    ) -> None:
        parts = urlsplit(settings.url)
        if parts.username is not None and auth is None:  # user:password in the URL: basic auth, then forgotten
            auth = (unquote(parts.username), unquote(parts.password or ""))
        netloc = parts.netloc.rpartition("@")[2]
        self.base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.settings = settings
        self.retries = max(0, min(settings.retries, MAX_RETRIES))
        self.attempts = 0
        self._session = requests.Session()
        adapter = DeadlineAdapter()
        for scheme in ("http://", "https://"):
            self._session.mount(scheme, adapter)
        self._session.auth = auth
        self._session.headers.update(headers or {})
        self._explain = explain or (lambda r: r.text[:300])
        self._sleep = sleep
        self._jitter = jitter

    def close(self) -> None:
        """Close the pooled connections."""
        self._session.close()

    def where(self, path: str = "") -> str:
        """``<backend> <url>`` for messages (no credentials: they were taken out of the URL)."""
        return f"{self.settings.backend} {self.base}{path}"

    def request(
        self,
        method: str,
        path: str,
        *,
        allow: tuple[int, ...] = (),
        frame_errors: tuple[int, ...] = (),
        timeout: float | None = None,
        **kwargs: Any,
    ) -> HttpResponse:
        """One logical request; returns a 2xx answer or one whose status is in ``allow``.

        ``frame_errors``: 4xx statuses meaning "this request's data is bad", raised as
        ``SkippableConnectorError`` (the frame fails, the run goes on).  ``kwargs`` go to requests.
        """
        where = self.where(path)
        attempts = self.retries + 1
        for attempt in range(attempts):
            self.attempts += 1
            retry_after = None
            try:
                response = self._send(method, self.base + path, timeout or self.settings.timeout, kwargs)
            except (requests.exceptions.SSLError, urllib3.exceptions.SSLError) as exc:
                raise FatalConnectorError(redact(f"{where}: TLS: {exc}")) from None
            except (requests.RequestException, urllib3.exceptions.HTTPError, _DeadlineExceeded) as exc:
                reason = _describe(exc)
            else:
                if response.status < 300 or response.status in allow:
                    return response
                reason = f"HTTP {response.status}: {self._explain(response)}"
                if not is_retried_status(response.status):
                    raise _refusal(where, response, reason, frame_errors)
                retry_after = response.headers.get("Retry-After")
            if attempt + 1 < attempts:
                delay = self._delay(attempt, retry_after)
                LOG.info("%s: %s; retry %d/%d in %.2fs", where, redact(reason), attempt + 1, attempts - 1, delay)
                self._sleep(delay)
        raise RetriableConnectorError(redact(f"{where}: {reason} (after {attempts} attempts)"))

    def _send(self, method: str, url: str, timeout: float, kwargs: dict[str, Any]) -> HttpResponse:
        deadline = Deadline(timeout)
        late = f"Timeout: no complete answer within {timeout}s (timed out)"
        try:
            # verify per request: a session-level ``verify`` loses to $REQUESTS_CA_BUNDLE in requests
            with deadline, self._session.request(
                method, url, timeout=timeout, verify=self.settings.verify, allow_redirects=False, stream=True,
                cert=self.settings.cert, **kwargs,
            ) as response:
                chunks = []
                while chunk := response.raw.read1(_CHUNK, decode_content=True):
                    chunks.append(chunk)
        except Exception as exc:
            if deadline.expired:  # whatever the cut-off looked like (a reset, a short read)
                raise _DeadlineExceeded(late) from exc
            raise
        if deadline.expired:  # cut off as the body ended: it may be short
            raise _DeadlineExceeded(late)
        return HttpResponse(response.status_code, response.headers, b"".join(chunks))

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = self._jitter(min(self.settings.backoff * 2**attempt, MAX_BACKOFF))
        if retry_after:
            with contextlib.suppress(urllib3.exceptions.InvalidHeader):  # an unreadable header is ignored
                delay = max(delay, Retry().parse_retry_after(retry_after))  # seconds or an HTTP-date
        return min(delay, MAX_BACKOFF)


def _describe(exc: Exception) -> str:
    """What went wrong with an exchange, in words (Python's exception names say little to a user)."""
    if isinstance(exc, _DeadlineExceeded):
        return str(exc)
    broken = (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError)
    if isinstance(exc, broken):
        details = [a for a in exc.args if isinstance(a, BaseException)] + [exc.__context__]
        chunk = next((d for d in details if isinstance(d, urllib3.exceptions.InvalidChunkLength)), None)
        if chunk is not None:
            return f"the server broke off its answer: invalid chunked encoding (a chunk length of {chunk.length!r})"
        short = next((d for d in details if isinstance(d, http.client.IncompleteRead)), None)
        if short is not None:
            read = short.partial if isinstance(short.partial, int) else len(short.partial)  # urllib3's, http.client's
            return (f"the server broke off its answer after {read} byte(s) of the body (a body shorter than "
                    "announced, or a broken chunked encoding)")
        first = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        return f"the server broke off its answer ({first})"
    return f"{type(exc).__name__}: {exc}"


def _refusal(where: str, response: HttpResponse, reason: str, frame_errors: tuple[int, ...]) -> Exception:
    """The error of an answer that retrying cannot change."""
    if 300 <= response.status < 400:
        location = redact(response.headers.get("Location", "?"))
        return FatalConnectorError(
            f"{where}: redirected to {location} (HTTP {response.status}); redirects are not followed, "
            "configure the final URL"
        )
    if response.status in (401, 403):
        return FatalConnectorError(redact(f"{where}: authentication refused: {reason}"))
    if response.status in frame_errors:
        return SkippableConnectorError(redact(f"{where}: {reason}"))
    return FatalConnectorError(redact(f"{where}: {reason}"))
