"""``connectors.http`` against local HTTP servers started here (no mock of the client): retries with
jitter counted on the server side, Retry-After in seconds and as an HTTP-date, the whole-request
timeout against a trickling server, redirects, credentials kept out of messages and logs, and the
classification of refusals."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError, SkippableConnectorError
from ratebeam.connectors.http import MAX_BACKOFF, MAX_RETRIES, HttpClient, HttpSettings, full_jitter, redact


class _Scripted(BaseHTTPRequestHandler):
    """Answers with the next (status, headers, body) of ``server.script`` (then ``server.last``)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.server.seen.append((self.path, dict(self.headers)))
        status, headers, body = self.server.script.pop(0) if self.server.script else self.server.last
        if body == "trickle":
            self._trickle()
            return
        data = body.encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _trickle(self):
        """Headers at once, then one byte every 50 ms of a body that would take 50 s."""
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    httpd.daemon_threads = True
    httpd.script, httpd.seen, httpd.last = [], [], (200, {}, "{}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url(httpd: ThreadingHTTPServer, userinfo: str = "") -> str:
    return f"http://{userinfo}127.0.0.1:{httpd.server_address[1]}/base"


def make(base: str, sleeps: list[float] | None = None, jitter=lambda cap: cap, **settings) -> HttpClient:
    settings.setdefault("timeout", 5)
    return HttpClient(HttpSettings(base, "testsrv", **settings), sleep=(sleeps if sleeps is not None else []).append,
                      jitter=jitter)


def test_503_three_times_then_200_with_jittered_backoff(server):
    server.script = [(503, {}, "busy")] * 3
    sleeps: list[float] = []
    caps: list[float] = []

    def half(cap: float) -> float:
        caps.append(cap)
        return cap / 2

    client = make(url(server), sleeps, jitter=half, retries=3, backoff=0.1)
    assert client.request("GET", "/x").status == 200
    assert len(server.seen) == 4 and client.attempts == 4  # counted on both sides
    assert caps == [0.1, 0.2, 0.4] and sleeps == [0.05, 0.1, 0.2]  # exponential cap, then the jitter's draw


def test_full_jitter_draws_in_zero_to_cap():
    draws = [full_jitter(2.0) for _ in range(200)]
    assert all(0.0 <= d <= 2.0 for d in draws) and len(set(draws)) > 100


def test_retries_are_bounded_then_retriable(server):
    server.last = (502, {}, "bad gateway")
    client = make(url(server), retries=50, backoff=0)
    with pytest.raises(RetriableConnectorError, match=r"testsrv http://127.0.0.1:\d+/base/x: HTTP 502.*after 11 attempts"):
        client.request("GET", "/x")
    assert len(server.seen) == MAX_RETRIES + 1


def test_retry_after_in_seconds_is_honoured_and_capped(server):
    server.script = [(429, {"Retry-After": "7"}, "slow down"), (503, {"Retry-After": "3600"}, "maintenance")]
    sleeps: list[float] = []
    assert make(url(server), sleeps, jitter=lambda cap: 0.0, retries=2).request("GET", "/x").status == 200
    assert sleeps == [7.0, MAX_BACKOFF]


def test_retry_after_as_an_http_date_is_honoured(server):
    server.script = [(503, {"Retry-After": formatdate(time.time() + 20, usegmt=True)}, "later")]
    sleeps: list[float] = []
    assert make(url(server), sleeps, jitter=lambda cap: 0.0, retries=1).request("GET", "/x").status == 200
    (pause,) = sleeps
    assert 15 < pause <= 20  # the date, 20 s ahead at whole-second resolution, minus the time spent


def test_a_trickling_server_times_out_within_the_timeout(server):
    server.last = (200, {}, "trickle")
    client = make(url(server), timeout=0.5, retries=0)
    started = time.monotonic()
    with pytest.raises(RetriableConnectorError, match="timed out"):
        client.request("GET", "/x")
    assert time.monotonic() - started < 1.5  # not the 50 s the body would take


def test_a_redirect_to_another_host_is_not_followed(server):
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    other.script, other.seen, other.last = [], [], (200, {}, "{}")
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        server.last = (302, {"Location": f"http://localhost:{other.server_address[1]}/steal"}, "")
        client = make(url(server, "alice:s3cret@"), retries=3)
        with pytest.raises(FatalConnectorError, match="redirected to http://localhost:.*not followed") as info:
            client.request("GET", "/x")
        assert other.seen == [] and len(server.seen) == 1
        assert "s3cret" not in str(info.value)
    finally:
        other.shutdown()
        other.server_close()


def test_credentials_in_the_url_are_used_but_never_printed(server, caplog):
    server.last = (500, {}, "down")
    client = make(url(server, "alice:s3cret@"), retries=1)
    with caplog.at_level(logging.DEBUG), pytest.raises(RetriableConnectorError) as info:
        client.request("GET", "/x")
    sent = server.seen[0][1]["Authorization"]
    assert base64.b64decode(sent.removeprefix("Basic ")) == b"alice:s3cret"
    assert "s3cret" not in str(info.value) and "s3cret" not in caplog.text and "alice" not in caplog.text
    assert "retry 1/1" in caplog.text  # the retry was logged, without the credentials
    assert redact("see https://u:p@h:1/x and http://v:q@k/") == "see https://h:1/x and http://k/"


@pytest.mark.parametrize(
    ("status", "error", "match"),
    [(401, FatalConnectorError, "authentication refused: HTTP 401"),
     (403, FatalConnectorError, "authentication refused: HTTP 403"),
     (404, FatalConnectorError, "HTTP 404"),
     (400, SkippableConnectorError, "HTTP 400: bad query")],
)
def test_refusals_are_classified_once_and_not_retried(server, status, error, match):
    server.last = (status, {}, "bad query" if status == 400 else "no")
    client = make(url(server), retries=3)
    with pytest.raises(error, match=match):
        client.request("GET", "/x", frame_errors=(400,))
    assert len(server.seen) == 1


def test_allowed_statuses_are_returned(server):
    server.last = (404, {}, "missing")
    response = make(url(server), retries=3).request("GET", "/x", allow=(404,))
    assert (response.status, response.text) == (404, "missing") and len(server.seen) == 1


def test_tls_to_a_plain_http_server_is_fatal_at_once(server):
    client = make(url(server).replace("http://", "https://"), retries=3)
    with pytest.raises(FatalConnectorError, match="TLS"):
        client.request("GET", "/x")
    assert client.attempts == 1
