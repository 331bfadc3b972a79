"""``ratebeam run`` against hostile HTTP servers started here.

A threaded ``http.server`` on 127.0.0.1 plays Prometheus (collector and fetcher) or InfluxDB
(storage) and answers what a broken proxy or a malicious server would: a redirect to another
host, bytes trickled one every 0.2 s, JSON without the keys or with the wrong types, JSON nested
100,000 deep, a broken chunked encoding.  Each run must end with its exit status and a message
that says what the server sent — never a Python internal (``KeyError: 'value'``,
``RecursionError``, ``ChunkedEncodingError``) — within the configured timeout; a redirect is never
followed and credentials never reach the other host; a refused run leaves the database and the
storage unchanged, a failed frame stores nothing and commits nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hardening_support import configure, copied, one_line, one_sample, query, run, snapshot

NOW = "2026-01-01T03:00:00Z"
SECRET = "s3cret-pw"
GOOD_SERIES = {"metric": {"project_id": "p1", "id": "vm-1", "flavor_name": "m1.small"}, "value": [1704070800, "1"]}
DEEP = 100_000


def vector(*series: object) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(series)}})


Reply = Callable[[BaseHTTPRequestHandler], None]


def send(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        data = body.encode()
        handler.send_response(status)
        # it closes every connection after one answer: says so, so that no client reuses one
        for key, value in {"Content-Type": "application/json", "Connection": "close", **(headers or {})}.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    return reply


#: Seconds between two bytes of a trickling answer.  Well under the 1 s ``timeout`` the tests set, so
#: that the socket's own per-read timeout cannot fire before the whole-exchange deadline does: at
#: 0.5 s, a loaded machine (the CI run's two workers) delayed a byte past 1 s once and the request
#: failed on its read timeout, not on the deadline the test checks.
TRICKLE_SECONDS = 0.2


def trickle(headers_too: bool) -> Reply:
    """One byte every ``TRICKLE_SECONDS``: of the headers (``headers_too``) or of the body after prompt headers."""
    def reply(handler: BaseHTTPRequestHandler) -> None:
        body = vector(GOOD_SERIES).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        slow = head + body if headers_too else body
        if not headers_too:
            handler.wfile.write(head)
        try:
            for byte in slow:
                if handler.server.closing.is_set():
                    return
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(TRICKLE_SECONDS)
        except (BrokenPipeError, ConnectionResetError):
            pass
    return reply


def broken_chunks(handler: BaseHTTPRequestHandler) -> None:
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"zz\r\n{}\r\n0\r\n\r\n")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        reply = self.server.routes.get(self.path.split("?")[0], self.server.default)
        reply(self)
        self.close_connection = True

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[Callable[[], ThreadingHTTPServer]]:
    """Start hostile servers on demand; each has ``routes`` {path: reply}, ``default`` and ``seen``."""
    started: list[ThreadingHTTPServer] = []

    def start() -> ThreadingHTTPServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads, httpd.block_on_close = True, False
        httpd.routes, httpd.seen, httpd.closing = {}, [], threading.Event()
        httpd.default = send('{"error": "no such route"}', 404)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return httpd

    yield start
    for httpd in started:
        httpd.closing.set()
        httpd.shutdown()
        httpd.server_close()


def base(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return one_sample(tmp_path_factory.mktemp("hostile") / "ws")


def prometheus(httpd: ThreadingHTTPServer, **options: object) -> dict[str, object]:
    return {"backend": "prometheus", "url": f"{base(httpd)}/api/v1", "timeout": 1, "retries": 0,
            "username": "rater", "password": SECRET, **options}


def dead_letters(ws: Path) -> list[str]:
    return [reason for (reason,) in query(ws, "SELECT reason FROM ratebeam_dead_letters")]


def assert_frames_failed(ws: Path, status: int, err: str, *says: str) -> str:
    """Exit 1, every frame failed with a reason saying ``says``, nothing stored or committed, no lease left."""
    assert status == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    reasons = dead_letters(ws)
    assert reasons, err[-3000:]
    for reason in reasons:
        for text in says:
            assert text in reason, reason
        for internal in ("KeyError", "AttributeError", "TypeError", "RecursionError", "ChunkedEncodingError",
                         "ProtocolError", "JSONDecodeError", "IndexError"):
            assert internal not in reason, reason
    assert query(ws, "SELECT count(*) FROM cloudkitty_storage_states WHERE last_processed_timestamp IS NOT NULL") \
        == [(0,)]
    assert query(ws, "SELECT count(*) FROM ratebeam_scope_leases") == [(0,)]
    assert not list((ws / "rated").rglob("*.parquet")) if (ws / "rated").exists() else True
    assert SECRET not in err
    return reasons[0]


# ---- the harness works: a well-behaved answer is rated ----


def test_a_well_formed_prometheus_answer_is_rated(template, tmp_path, capsys, servers):
    ws, prom = copied(template, tmp_path), servers()
    prom.routes["/api/v1/query"] = send(vector(GOOD_SERIES))
    configure(ws, collector=prometheus(prom))
    status, err = run(ws, capsys, NOW)
    assert status == 0, err
    assert list((ws / "rated").rglob("*.parquet"))
    assert all(headers.get("Authorization", "").startswith("Basic ") for _, _, headers in prom.seen)


def test_nan_and_inf_samples_are_no_sample_and_are_counted(template, tmp_path, capsys, servers):
    ws, prom = copied(template, tmp_path), servers()
    nan = {"metric": {"project_id": "p1", "id": "vm-2"}, "value": [1704070800, "NaN"]}
    inf = {"metric": {"project_id": "p1", "id": "vm-3"}, "value": [1704070800, "+Inf"]}
    prom.routes["/api/v1/query"] = send(vector(GOOD_SERIES, nan, inf))
    configure(ws, collector=prometheus(prom))
    status, err = run(ws, capsys, NOW)
    assert status == 0, err
    queries = len(prom.seen)  # one per metric: each answer carries the two non-finite samples
    assert f"samples: {2 * queries} NaN/Inf sample(s) dropped" in err, err


# ---- redirects: never followed, credentials never forwarded ----


def test_a_redirect_to_another_host_is_not_followed_and_stops_the_run(template, tmp_path, capsys, servers):
    ws, prom, other = copied(template, tmp_path), servers(), servers()
    other.routes["/api/v1/query"] = send(vector(GOOD_SERIES))
    prom.routes["/api/v1/query"] = send("", 301, {"Location": f"{base(other)}/api/v1/query"})
    configure(ws, collector=prometheus(prom))
    before = snapshot(ws)
    status, err = run(ws, capsys, NOW)
    assert status == 2, err
    line = one_line(err)
    assert f"redirected to {base(other)}/api/v1/query (HTTP 301); redirects are not followed" in line, line
    assert other.seen == []  # never asked, so never given the credentials
    assert SECRET not in err and snapshot(ws) == before


# ---- a trickling server: the whole request is bounded by ``timeout`` ----


@pytest.mark.parametrize("headers_too", [True, False], ids=["headers", "body"])
def test_a_trickling_prometheus_times_out_within_the_timeout(template, tmp_path, capsys, servers, headers_too):
    ws, prom = copied(template, tmp_path), servers()
    prom.routes["/api/v1/query"] = trickle(headers_too)
    configure(ws, collector=prometheus(prom))
    started = time.monotonic()
    status, err = run(ws, capsys, NOW)
    elapsed = time.monotonic() - started
    assert_frames_failed(ws, status, err, "no complete answer within 1.0s")
    requests = len(prom.seen)
    assert elapsed < 15 + 2 * requests, (elapsed, requests)  # Beam's start-up, then at most ~1 s per request


# ---- malformed answers: the frame fails saying what the server sent ----

MALFORMED = {
    "series without value": (vector({"metric": {"project_id": "p1"}}), "malformed series", "no 'value'"),
    "value not a pair": (vector({"metric": {"project_id": "p1"}, "value": "1"}), "malformed series", "'value'"),
    "value not a string": (vector({"metric": {"project_id": "p1"}, "value": [1704070800, 5]}),
                           "malformed series", "not a string"),
    "metric not an object": (vector({"metric": ["p1"], "value": [1704070800, "1"]}), "malformed series", "'metric'"),
    "series not an object": (vector(7), "malformed series", "7"),
    "label not a string": (vector({"metric": {"project_id": "p1", "id": {"x": 1}}, "value": [1704070800, "1"]}),
                           "malformed series", "label 'id'"),
    "value not a number": (vector({"metric": {"project_id": "p1", "id": "vm-1"}, "value": [1704070800, "abc"]}),
                           "not a number", "'abc'"),
    "result not a list": (json.dumps({"status": "success", "data": {"resultType": "vector", "result": {}}}),
                          "malformed response", "data.result"),
    "deeply nested": ('{"status": "success", "data": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    "not JSON": ("<html>proxy error</html>", "not JSON", "<html>proxy error"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_prometheus_answer_fails_the_frame_saying_why(template, tmp_path, capsys, servers, case):
    body, *says = MALFORMED[case]
    ws, prom = copied(template, tmp_path), servers()
    prom.routes["/api/v1/query"] = send(body)
    configure(ws, collector=prometheus(prom))
    status, err = run(ws, capsys, NOW)
    assert_frames_failed(ws, status, err, "prometheus", *says)


def test_a_broken_chunked_encoding_fails_the_frame_saying_so(template, tmp_path, capsys, servers):
    ws, prom = copied(template, tmp_path), servers()
    prom.routes["/api/v1/query"] = broken_chunks
    configure(ws, collector=prometheus(prom))
    status, err = run(ws, capsys, NOW)
    assert_frames_failed(ws, status, err, "broke off its answer", "chunked")


# ---- the Prometheus fetcher: no scope list, so the run stops, saying why ----

FETCHER_MALFORMED = {
    "series not an object": (vector(7), "malformed series (not an object): 7"),
    "deeply nested": ('{"status": "success", "data": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    "missing data": (json.dumps({"status": "success"}), "malformed response (no data.result)"),
}


@pytest.mark.parametrize("case", FETCHER_MALFORMED)
def test_a_malformed_fetcher_answer_stops_the_run_before_any_change(template, tmp_path, capsys, servers, case):
    body, says = FETCHER_MALFORMED[case]
    ws, prom = copied(template, tmp_path), servers()
    prom.routes["/api/v1/query"] = send(body)
    configure(ws, fetcher={**prometheus(prom), "metric": "openstack_identity_project_info"})
    before = snapshot(ws)
    status, err = run(ws, capsys, NOW)
    assert status == 2, err
    line = one_line(err)
    assert "prometheus fetcher: cannot list the scopes" in line and says in line, line
    for internal in ("RecursionError", "KeyError", "AttributeError"):
        assert internal not in line
    assert snapshot(ws) == before


# ---- a storage backend: InfluxDB ----


def influx(httpd: ThreadingHTTPServer) -> dict[str, object]:
    return {"backends": [{"backend": "influxdb", "url": base(httpd), "database": "rated", "timeout": 1,
                          "retries": 0, "username": "rater", "password": SECRET}]}


INFLUX_MALFORMED = {
    "not JSON": ("this is not json", "not JSON", "this is not json"),
    "deeply nested": ('{"results": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    "results not a list": ('{"results": "x"}', "malformed InfluxQL answer", "results"),
    "series not an object": ('{"results": [{"statement_id": 0, "series": [5]}]}', "malformed InfluxQL answer",
                             "series"),
    "values not rows": ('{"results": [{"statement_id": 0, "series": [{"columns": ["name"], "values": "rated"}]}]}',
                        "malformed InfluxQL answer", "values"),
}


@pytest.mark.parametrize("case", INFLUX_MALFORMED)
def test_a_malformed_influxdb_answer_fails_the_frames_saying_why(template, tmp_path, capsys, servers, case):
    body, *says = INFLUX_MALFORMED[case]
    ws, db = copied(template, tmp_path), servers()
    db.routes["/query"] = send(body)
    db.routes["/write"] = send("", 204)
    configure(ws, storage=influx(db))
    status, err = run(ws, capsys, NOW)
    assert_frames_failed(ws, status, err, "influxdb storage", *says)
    assert not [path for _, path, _ in db.seen if path.startswith("/write")]  # nothing written


def test_an_influxdb_redirect_is_not_followed_and_stops_the_run(template, tmp_path, capsys, servers):
    ws, db, other = copied(template, tmp_path), servers(), servers()
    db.routes["/query"] = send("", 307, {"Location": f"{base(other)}/query"})
    configure(ws, storage=influx(db))
    status, err = run(ws, capsys, NOW)
    assert status == 2, err
    line = one_line(err)
    assert f"influxdb storage {base(db)}/query: redirected to {base(other)}/query (HTTP 307)" in line, line
    assert other.seen == [] and SECRET not in err
    assert query(ws, "SELECT count(*) FROM ratebeam_scope_leases") == [(0,)]
    assert query(ws, "SELECT count(*) FROM cloudkitty_storage_states WHERE last_processed_timestamp IS NOT NULL") \
        == [(0,)]


def test_a_trickling_influxdb_times_out_within_the_timeout(template, tmp_path, capsys, servers):
    ws, db = copied(template, tmp_path), servers()
    db.routes["/query"] = trickle(headers_too=True)
    configure(ws, storage=influx(db))
    started = time.monotonic()
    status, err = run(ws, capsys, NOW)
    elapsed = time.monotonic() - started
    assert_frames_failed(ws, status, err, "influxdb storage", "no complete answer within 1.0s")
    assert elapsed < 15 + 2 * len(db.seen), (elapsed, len(db.seen))


# ---- a storage backend: OpenSearch (index mapping, bulk writes, searches for stale points) ----

MAPPING = json.dumps({"rated": {"mappings": {"properties": {}}}})
HITS = json.dumps({"hits": {"total": {"value": 0}, "hits": []}})
SEARCH_MALFORMED = {
    "mapping not JSON": ({"/rated/_mapping": "<html>proxy</html>"}, "/rated/_mapping", "not JSON", "<html>proxy"),
    "mapping null": ({"/rated/_mapping": "null"}, "/rated/_mapping", "not a JSON object", "null"),
    "mapping a list": ({"/rated/_mapping": "[1, 2]"}, "/rated/_mapping", "not a JSON object", "[1, 2]"),
    "mapping without properties": ({"/rated/_mapping": '{"rated": {"mappings": 5}}'}, "malformed mapping answer"),
    "mapping nested deeply": ({"/rated/_mapping": "[" * DEEP + "]" * DEEP}, "nested too deeply"),
    "bulk items not a list": ({"/rated/_bulk": '{"errors": true, "items": 5}'}, "malformed bulk answer", '"items": 5'),
    "bulk item not an object": ({"/rated/_bulk": '{"errors": true, "items": [7]}'}, "malformed bulk answer"),
    "bulk status not a number": ({"/rated/_bulk": '{"errors": true, "items": [{"index": {"status": "x"}}]}'},
                                 "malformed bulk answer"),
    "deleted hit found again": ({"/rated/_search": '{"hits": {"total": {"value": 1}, "hits": [{"_id": "a"}]}}',
                                 "/rated/_bulk": '{"errors": true, "items": [{"delete": {"status": 200}}]}'},
                                "document 'a' is found again", "does not delete"),
    "hit without an id": ({"/rated/_search": '{"hits": {"total": {"value": 1}, "hits": [{"x": 1}]}}'},
                          "malformed search answer", "has no '_id'"),
}


@pytest.mark.parametrize("case", SEARCH_MALFORMED)
def test_a_malformed_opensearch_answer_fails_the_frames_saying_why(template, tmp_path, capsys, servers, case):
    """Each answer used to reach the reader (``AttributeError``: a run dead of a bug), or loop for ever."""
    routes, *says = SEARCH_MALFORMED[case]
    ws, node = copied(template, tmp_path), servers()
    node.routes.update({"/rated/_mapping": send(MAPPING), "/rated/_bulk": send('{"errors": false, "items": []}'),
                        "/rated/_refresh": send("{}"), "/rated/_search": send(HITS)})
    node.routes.update({path: send(body) for path, body in routes.items()})
    configure(ws, storage={"backends": [{"backend": "opensearch", "url": base(node), "index_name": "rated",
                                         "timeout": 1}]})
    status, err = run(ws, capsys, NOW)
    assert_frames_failed(ws, status, err, f"opensearch storage {base(node)}", *says)


# ---- Keystone's token request (keystoneauth's own request loop) ----


def test_a_trickling_keystone_token_answer_times_out_within_the_timeout(template, tmp_path, capsys, servers):
    """keystoneauth bounded each read only: a byte every 0.5 s kept the token request alive ~2 minutes."""
    ws, keystone = copied(template, tmp_path), servers()
    keystone.routes["/v3/auth/tokens"] = trickle(headers_too=True)
    configure(ws, fetcher={"backend": "keystone", "url": f"{base(keystone)}/v3", "username": "rating",
                           "password": SECRET, "project_name": "service", "user_domain_name": "Default",
                           "project_domain_name": "Default", "timeout": 1, "retries": 0})
    before = snapshot(ws)
    started = time.monotonic()
    status, err = run(ws, capsys, NOW)
    elapsed = time.monotonic() - started
    assert status == 2, err
    line = one_line(err)
    assert f"keystone {base(keystone)}" in line and "no complete answer within 1.0s" in line, line
    assert elapsed < 20, elapsed
    assert SECRET not in err and snapshot(ws) == before
