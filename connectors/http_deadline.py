"""A deadline on a whole HTTP exchange, which neither requests nor urllib3 has.

Their ``timeout`` bounds each socket operation, so a server trickling one byte every 0.5 s — of
its status line, its headers or its body — keeps a ``timeout: 1`` request alive forever (issue
#18).  Here a timer shuts the request's socket down when the deadline passes: a blocked read
returns at once and the exchange fails, whatever phase it was in.

How the timer finds the socket: ``DeadlineAdapter`` (a requests transport adapter) makes urllib3
build its connections from classes that, when a request starts on them, register with the
``Deadline`` the calling thread is running under (``with deadline:``).  A connection reused from
the pool registers again for its next request.  ``BoundedSession`` does the same for a client that
brings its own request loop (keystoneauth): each of its requests is bounded by its ``timeout``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3 import PoolManager, ProxyManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()


class Deadline:
    """``with Deadline(seconds):`` — the request sent in the block is cut off after ``seconds``.

    ``expired`` says whether it was (the error the cut-off causes is then a timeout).
    """

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._connection: HTTPConnection | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        # nested (keystoneauth's token request inside another request's auth hook): the outer one
        # is the thread's deadline again once the inner one ends
        self._outer = getattr(_current, "deadline", None)
        _current.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _current.deadline = self._outer

    def watch(self, connection: HTTPConnection) -> None:
        """Cut ``connection`` off when the deadline passes (at once if it already has)."""
        with self._lock:
            self._connection = connection
            if not self.expired:
                return
        _shut(connection)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            connection = self._connection
        if connection is not None:
            _shut(connection)


def _shut(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing left to cut off
            sock.shutdown(socket.SHUT_RDWR)


class _Watched:
    """Registers the connection with the thread's deadline each time a request starts on it."""

    def request(self, *args: Any, **kwargs: Any) -> None:
        deadline = getattr(_current, "deadline", None)
        if deadline is not None:
            deadline.watch(self)  # self is the HTTPConnection this is mixed into
        super().request(*args, **kwargs)  # type: ignore[misc]  # the HTTPConnection's


class _Connection(_Watched, HTTPConnection):
    pass


class _TLSConnection(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections a ``Deadline`` can cut off (mount it for http and https)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Make requests' pool manager, building its pools from the watched connection classes."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> PoolManager:
        """Make requests' manager for an HTTP(S) proxy (``$HTTPS_PROXY``), watched too (SOCKS keeps its own)."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):
            manager.pool_classes_by_scheme = _POOLS
        return manager


_POOLS: dict[str, type[HTTPConnectionPool]] = {"http": _Pool, "https": _TLSPool}


class BoundedSession(requests.Session):
    """A ``requests.Session`` each request of which is bounded as a whole by its ``timeout``.

    For clients that take a session and read the answer themselves (keystoneauth): the body is read
    inside ``request`` (no ``stream``), so the deadline covers the status line, headers and body.  A
    request cut off is ``requests.exceptions.Timeout``, which such clients know as a timeout.
    """

    def __init__(self) -> None:
        super().__init__()
        adapter = DeadlineAdapter()
        for scheme in ("http://", "https://"):
            self.mount(scheme, adapter)

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        """The ``request`` of requests, cut off ``timeout`` seconds after it starts (the longest of a pair)."""
        timeout = kwargs.get("timeout")
        if timeout is None or kwargs.get("stream"):
            return super().request(method, url, *args, **kwargs)
        seconds = max(timeout) if isinstance(timeout, tuple) else float(timeout)
        deadline = Deadline(seconds)
        try:
            with deadline:
                return super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            if deadline.expired:
                raise requests.exceptions.Timeout(f"no complete answer within {seconds}s") from exc
            raise
