"""``/healthz/live``, ``/healthz/ready`` and ``/metrics`` of a long-running command, on one port.

Why: ``serve``, ``events serve`` and ``rpc`` each run a loop that can hang and depend on servers
that can go away.  An orchestrator (Kubernetes probes, a systemd watchdog script, a load balancer)
and Prometheus need the same three answers from each:

* **live** (``/healthz/live``): the loop's heartbeat (:meth:`ServiceMonitor.beat`, once per poll of
  the job or of the stop request) is younger than ``stale_after`` seconds.  A hung loop — a call to
  the runner that never returns, a deadlock — answers 503 and is restarted; a slow database is
  not a reason to restart, so liveness never touches it.
* **ready** (``/healthz/ready``): every named check passes now (the database answers ``SELECT 1``,
  the runner's job is running, the stream's broker accepts a connection).  503 names the failing
  check in one line; readiness takes the instance out of rotation, it does not restart it.  Each
  check is bounded by ``CHECK_SECONDS`` so a probe never hangs on an unreachable host.
* **metrics** (``/metrics``): prometheus-client's own exposition of the registry (the maintained
  library, the text format Prometheus expects), with the figures of ``ops.figures``.

The server is prometheus-client's threading WSGI server in a daemon thread: a scrape never waits
for the loop, and the loop never waits for a scrape.

Under systemd (``Type=notify``, ``$NOTIFY_SOCKET`` set) the same two answers go to the service
manager (``sd_notify``'s datagram protocol, a few lines, no library): ``READY=1`` at the first
heartbeat whose checks all pass, ``WATCHDOG=1`` at every later heartbeat (``WatchdogSec=`` kills
and restarts a loop that stops beating), ``STOPPING=1`` when the service stops.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

if TYPE_CHECKING:
    from prometheus_client.registry import Collector, CollectorRegistry

LOG = logging.getLogger(__name__)

#: A loop that has not beaten for this long is not alive (its polls are a second or a few apart).
STALE_AFTER_SECONDS = 60.0
#: The longest one readiness check may take before it counts as failed.
CHECK_SECONDS = 5.0

Check = Callable[[], None]  # raises (any exception) when not ready; its message is the reason


class _QuietHandler(WSGIRequestHandler):
    """No access log line per probe or scrape (every few seconds, forever)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing."""


class ServiceMonitor:
    """A service's heartbeat, readiness checks and metrics registry, served on ``port`` when one is given.

    Without a port nothing listens and the figures are only logged by the caller; the heartbeat and
    checks still work (``ready()`` is used in tests and by ``config check --connect``).
    """

    def __init__(self, name: str, port: int | None = None, host: str = "0.0.0.0",
                 stale_after: float = STALE_AFTER_SECONDS) -> None:
        self.name = name
        self.stale_after = stale_after
        self._beat = time.monotonic()
        self._told_ready = False
        self._checks: dict[str, Check] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{name}-health")
        self.registry: CollectorRegistry | None = None
        self._server: Any = None
        if port is None:
            return
        from ratebeam.connectors.extras import require_extra

        prometheus_client = require_extra("service", "--metrics-port")
        self.registry = prometheus_client.CollectorRegistry()
        from prometheus_client.exposition import ThreadingWSGIServer

        app = _routes(self, prometheus_client.make_wsgi_app(self.registry))
        self._server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        threading.Thread(target=self._server.serve_forever, name=f"{name}-metrics", daemon=True).start()
        LOG.info("%s: health on http://%s:%d/healthz/live and /healthz/ready, metrics on /metrics", name, host, port)

    def register(self, collector: Collector) -> None:
        """Expose ``collector``'s figures on ``/metrics`` (nothing without a port)."""
        if self.registry is not None:
            self.registry.register(collector)

    def add_check(self, name: str, check: Check) -> None:
        """A readiness condition: ``check()`` returns when it holds and raises (with the reason) when not."""
        self._checks[name] = check

    def beat(self) -> None:
        """The loop is alive: called once per turn of it (and told to systemd when it listens)."""
        self._beat = time.monotonic()
        if not os.environ.get("NOTIFY_SOCKET"):
            return
        if self._told_ready:
            notify("WATCHDOG=1")
        elif self.ready()[0]:
            self._told_ready = True
            notify("READY=1")

    def live(self) -> tuple[bool, str]:
        """Whether the loop beat within ``stale_after`` seconds, and how long ago it did."""
        age = time.monotonic() - self._beat
        return age <= self.stale_after, f"last heartbeat {age:.1f}s ago (stale after {self.stale_after:.0f}s)"

    def ready(self) -> tuple[bool, dict[str, str]]:
        """Whether every check passes now, and each check's answer (``ok`` or its reason)."""
        answers = {}
        futures = {name: self._pool.submit(check) for name, check in self._checks.items()}
        for name, future in futures.items():
            try:
                future.result(timeout=CHECK_SECONDS)
                answers[name] = "ok"
            except FutureTimeout:
                answers[name] = f"no answer within {CHECK_SECONDS:.0f}s"
            except Exception as exc:  # any failure is "not ready", said in its own words
                answers[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return all(a == "ok" for a in answers.values()), answers

    def close(self) -> None:
        """Stop listening (the port is free again); tell systemd the service is stopping."""
        if os.environ.get("NOTIFY_SOCKET"):
            notify("STOPPING=1")
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._pool.shutdown(wait=False)


def notify(message: str) -> None:
    """Send ``message`` to the service manager's ``$NOTIFY_SOCKET`` (``@`` is the abstract namespace)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:  # the manager went away: nothing to tell, nothing to stop for
        LOG.debug("sd_notify %s: %s", message, exc)


def _routes(monitor: ServiceMonitor, metrics_app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: the two health paths, everything else to prometheus-client's app."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz/live":
            ok, detail = monitor.live()
            return _answer(start_response, ok, {"live": ok, "detail": detail})
        if path == "/healthz/ready":
            ok, checks = monitor.ready()
            return _answer(start_response, ok, {"ready": ok, "checks": checks})
        return metrics_app(environ, start_response)

    return app


def _answer(start_response: Callable[..., Any], ok: bool, body: dict[str, Any]) -> Iterator[bytes]:
    data = json.dumps(body, sort_keys=True).encode()
    start_response("200 OK" if ok else "503 Service Unavailable",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    yield data


def database_check(database_url: str) -> Check:
    """Ready when the database answers ``SELECT 1`` (one pooled engine, reused by every probe)."""
    import sqlalchemy as sa

    from ratebeam.connectors.sql.engine import make_engine

    engine = make_engine(database_url)

    def check() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    return check


def broker_check(broker_url: str) -> Check:
    """Ready when the message broker accepts a connection (the event stream's RabbitMQ)."""

    def check() -> None:
        import kombu

        with kombu.Connection(broker_url, connect_timeout=CHECK_SECONDS) as connection:
            connection.ensure_connection(max_retries=1)

    return check


class JobState:
    """The state of what the service runs (the runner's job, the RPC server) as last seen: ready only while it runs."""

    def __init__(self, what: str = "the runner's job") -> None:
        self.what = what
        self.state = "STARTING"

    def check(self) -> None:
        """Raise unless it runs."""
        if self.state != "RUNNING":
            raise RuntimeError(f"{self.what} is {self.state}")
