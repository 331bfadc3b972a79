"""The Prometheus HTTP client: TLS and basic auth against a real Prometheus (its own web config), and
the retry policy against a local HTTP server that answers 503 / 429 / slowly on purpose (Prometheus
cannot be made to do that on demand)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3
from servers import prometheus as servers_prometheus
from servers.prometheus import SECURE_PASSWORD, SECURE_USER

from ratebeam.connectors.collectors.prometheus.client import (
    PrometheusClient,
    PrometheusConnection,
    PrometheusQueryError,
)
from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError

prometheus_secure_server = servers_prometheus.prometheus_secure_server  # the session fixture


def client(url: str, sleep=None, **options) -> PrometheusClient:
    options.setdefault("timeout", 5)
    # no jitter: the pauses are then exactly the backoff schedule
    return PrometheusClient(PrometheusConnection(url, **options), sleep=sleep or (lambda _s: None), jitter=lambda cap: cap)


# ---- TLS and basic auth (real Prometheus) ----


def test_tls_with_the_servers_ca_and_basic_auth(prometheus_secure_server):
    api = prometheus_secure_server.server.api
    c = client(api, cafile=prometheus_secure_server.cafile, username=SECURE_USER, password=SECURE_PASSWORD)
    assert c.query("vector(1)") == [{"metric": {}, "value": [pytest.approx(time.time(), abs=60), "1"]}]


def test_certificate_is_verified_by_default_and_not_retried(prometheus_secure_server):
    c = client(prometheus_secure_server.server.api, username=SECURE_USER, password=SECURE_PASSWORD, retries=3)
    with pytest.raises(FatalConnectorError, match="TLS"):
        c.query("vector(1)")
    assert c.requests == 1


def test_insecure_skips_verification(prometheus_secure_server):
    c = client(prometheus_secure_server.server.api, insecure=True, username=SECURE_USER, password=SECURE_PASSWORD)
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):
        assert c.query("vector(2)")[0]["value"][1] == "2"


def test_wrong_password_is_a_non_retriable_error(prometheus_secure_server):
    c = client(prometheus_secure_server.server.api, cafile=prometheus_secure_server.cafile,
               username=SECURE_USER, password="wrong", retries=3)
    with pytest.raises(PrometheusQueryError, match="HTTP 401") as info:
        c.query("vector(1)")
    assert info.value.query == "vector(1)" and c.requests == 1


# ---- retries, timeouts, bearer token (local HTTP server) ----


class _Script(BaseHTTPRequestHandler):
    """Answers each GET with the next (status, headers, body, delay) of ``server.script``; records headers."""

    def do_GET(self):
        self.server.seen.append(dict(self.headers))
        status, headers, body, delay = self.server.script.pop(0) if self.server.script else self.server.last
        time.sleep(delay)
        try:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body.encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


OK = (200, {"Content-Type": "application/json"},
      json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
          {"metric": {"project_id": "p1"}, "value": [1, "3"]}]}}), 0)


@pytest.fixture
def scripted() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Script)
    server.script, server.seen, server.last = [], [], OK
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def api(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/api/v1"


def test_5xx_and_429_are_retried_with_backoff(scripted):
    scripted.script = [(503, {}, "busy", 0), (502, {}, "bad gateway", 0), (429, {"Retry-After": "2"}, "slow down", 0)]
    sleeps: list[float] = []
    c = client(api(scripted), sleep=sleeps.append, retries=3, backoff=0.25)
    assert c.query("up")[0]["value"][1] == "3"
    assert c.requests == 4 and sleeps == [0.25, 0.5, 2.0]  # 2**n backoff; Retry-After wins when longer


def test_retries_are_bounded(scripted):
    scripted.last = (500, {}, "down", 0)
    c = client(api(scripted), retries=2)
    with pytest.raises(RetriableConnectorError, match="HTTP 500.*after 3 attempts.*query: up"):
        c.query("up")
    assert c.requests == 3


def test_every_request_has_a_timeout(scripted):
    scripted.last = (200, {}, "{}", 1.0)
    c = client(api(scripted), timeout=0.2, retries=1)
    started = time.monotonic()
    with pytest.raises(RetriableConnectorError, match="Timeout"):
        c.query("up")
    assert time.monotonic() - started < 1.5 and c.requests == 2


def test_bearer_token_and_query_parameters(scripted):
    client(api(scripted), bearer_token="tok-123").query("up", at=servers_prometheus.START)
    assert scripted.seen[0]["Authorization"] == "Bearer tok-123"


def test_non_json_and_malformed_bodies_are_errors(scripted):
    scripted.script = [(200, {}, "<html>proxy</html>", 0), (200, {}, json.dumps({"status": "success"}), 0)]
    c = client(api(scripted), retries=0)
    with pytest.raises(PrometheusQueryError, match="not JSON"):
        c.query("up")
    with pytest.raises(PrometheusQueryError, match="malformed"):
        c.query("up")
