"""A STAND-IN for Loki's read API (no real Loki can be had here: AGPL, no package ships it).

``LokiDouble`` is a small HTTP server on 127.0.0.1 that stores what is pushed to
``/loki/api/v1/push`` (JSON, gzip or not; identical stream + timestamp + line de-duplicated, as Loki
does) and answers ``/loki/api/v1/query_range`` and ``/loki/api/v1/delete`` in the formats of Loki's
HTTP API documentation ("Query logs within a range of time": ``{"status":"success","data":
{"resultType":"streams","result":[{"stream":{..},"values":[["<ns>","<line>"],..]}],"stats":{..}}}``;
"Request log deletion": ``query``/``start``/``end``, 204).  It understands only the LogQL subset
ratebeam and CloudKitty 25 emit and refuses anything else with 400, so a query Loki would not parse
fails the test: a stream selector (``=``, ``=~``, fully anchored), then either ``| json`` followed by
label filters (``name="v"``, joined by ``or`` inside parentheses or by ``,``) — read queries — or
line filters ``|= "text"`` / ``|~ "re"`` — delete queries (Loki's delete API takes no parser
stage).  ``| json`` flattens nested keys with ``_`` and renames a key that clashes with a stream
label or structured metadata to ``<key>_extracted``, as Loki does.  Unlike Loki, a delete is applied
at once (Loki filters deleted lines some minutes later and removes them after its cancel period).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

_STRING = r'"(?:[^"\\]|\\.)*"'
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MATCHER = re.compile(rf"\s*({_NAME})\s*(=~|=)\s*({_STRING})\s*")
_TEST = re.compile(rf"\s*({_NAME})\s*=\s*({_STRING})\s*")
_LINE_FILTER = re.compile(rf"\s*(\|=|\|~)\s*({_STRING})")


class LogQLError(ValueError):
    """A query outside the subset: answered 400, as Loki answers a parse error."""


def _literal(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise LogQLError(f"bad string literal {text}") from exc
    return value


def parse_selector(query: str) -> tuple[list[tuple[str, str, str]], str]:
    """``([(name, op, value)], rest)`` of a query starting with a stream selector."""
    if not query.startswith("{"):
        raise LogQLError(f"expected a stream selector: {query!r}")
    position, matchers = 1, []
    while True:
        match = _MATCHER.match(query, position)
        if not match:
            raise LogQLError(f"bad matcher at {query[position:]!r}")
        matchers.append((match[1], match[2], _literal(match[3])))
        position = match.end()
        if query.startswith(",", position):
            position += 1
            continue
        if query.startswith("}", position):
            return matchers, query[position + 1 :]
        raise LogQLError(f"expected , or }} at {query[position:]!r}")


def parse_label_stage(stage: str) -> list[list[tuple[str, str]]]:
    """A label filter stage as ANDed groups of ORed ``(name, value)`` tests."""
    stage = stage.strip()
    if stage.startswith("(") and stage.endswith(")"):
        tests = [_TEST.fullmatch(part) for part in _split(stage[1:-1], " or ")]
        if not all(tests):
            raise LogQLError(f"bad label filter {stage!r}")
        return [[(t[1], _literal(t[2])) for t in tests]]
    tests = [_TEST.fullmatch(part) for part in _split(stage, ",")]
    if not all(tests):
        raise LogQLError(f"bad label filter {stage!r}")
    return [[(t[1], _literal(t[2]))] for t in tests]


def _split(text: str, separator: str) -> list[str]:
    """``text`` split on ``separator`` outside string literals."""
    parts, start, position = [], 0, 0
    while position < len(text):
        if text[position] == '"':
            match = re.compile(_STRING).match(text, position)
            if not match:
                raise LogQLError(f"unterminated string in {text!r}")
            position = match.end()
        elif text.startswith(separator, position):
            parts.append(text[start:position])
            position += len(separator)
            start = position
        else:
            position += 1
    parts.append(text[start:])
    return parts


def parse_read(query: str) -> tuple[list[tuple[str, str, str]], list[list[tuple[str, str]]]]:
    """``{selector} | json | <label filter> | ...`` (or the selector alone)."""
    matchers, rest = parse_selector(query)
    stages = [s.strip() for s in _split(rest, "|")]
    if stages == [""]:
        return matchers, []
    if stages[0] != "" or len(stages) < 2 or stages[1] != "json":
        raise LogQLError(f"expected '| json' after the selector: {rest!r}")
    return matchers, [group for stage in stages[2:] for group in parse_label_stage(stage)]


def parse_delete(query: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """``{selector} |= "text" |~ "re" ...``: line filters only."""
    matchers, rest = parse_selector(query)
    filters, position = [], 0
    while position < len(rest.rstrip()):
        match = _LINE_FILTER.match(rest, position)
        if not match:
            raise LogQLError(f"delete queries take line filters only: {rest[position:]!r}")
        filters.append((match[1], _literal(match[2])))
        position = match.end()
    return matchers, filters


def _selects(matchers: list[tuple[str, str, str]], labels: dict[str, str]) -> bool:
    for name, op, value in matchers:
        got = labels.get(name, "")
        if op == "=" and got != value or op == "=~" and not re.fullmatch(value, got):
            return False
    return True


def _flatten(value: object, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}_{key}" if prefix else re.sub(r"[^A-Za-z0-9_]", "_", key), out)
    elif value is not None:
        out[prefix] = value if isinstance(value, str) else json.dumps(value)


def _parse_time(text: str) -> int:
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text) * 1e9) if len(text.split(".")[0]) <= 10 else int(text)
    moment = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", text)
    if not moment:
        raise LogQLError(f"bad time {text!r}")
    seconds = datetime.fromisoformat(moment[1] + "+00:00").timestamp()
    return int(seconds) * 1_000_000_000 + int((moment[2] or "0").ljust(9, "0"))


class LokiDouble:
    """The stand-in server: ``url`` is the API base (``…/loki/api/v1``), as CloudKitty configures it."""

    def __init__(self) -> None:
        #: tenant -> {(stream labels, ts, line): structured metadata}
        self.entries: dict[str | None, dict[tuple[tuple[tuple[str, str], ...], int, str], dict[str, str]]] = {}
        self.queries: list[str] = []
        self.deletes: list[dict[str, str]] = []
        self.pushes: list[dict[str, str]] = []
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                double.handle(self)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/loki/api/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(request.path)
        params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        tenant = request.headers.get("X-Scope-OrgID")
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        try:
            with self.lock:
                if parts.path == "/loki/api/v1/push" and request.command == "POST":
                    self.pushes.append(dict(request.headers))
                    if request.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    self.push(tenant, json.loads(body))
                    return self.answer(request, 204)
                if parts.path == "/loki/api/v1/query_range":
                    self.queries.append(params["query"])
                    return self.answer(request, 200, self.query_range(tenant, params))
                if parts.path == "/loki/api/v1/delete" and request.command == "POST":
                    self.deletes.append(params)
                    self.delete(tenant, params)
                    return self.answer(request, 204)
        except (LogQLError, KeyError, ValueError) as exc:
            return self.answer(request, 400, None, f"parse error: {exc}")
        self.answer(request, 404, None, "404 page not found")

    @staticmethod
    def answer(request: BaseHTTPRequestHandler, status: int, payload: object = None, text: str = "") -> None:
        data = json.dumps(payload).encode() if payload is not None else text.encode()
        request.send_response(status)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def push(self, tenant: str | None, payload: dict) -> None:
        store = self.entries.setdefault(tenant, {})
        for stream in payload["streams"]:
            labels = tuple(sorted(stream["stream"].items()))
            for value in stream["values"]:
                if not isinstance(value[0], str) or not isinstance(value[1], str):
                    raise LogQLError("timestamp and line must be strings")
                store.setdefault((labels, int(value[0]), value[1]), value[2] if len(value) > 2 else {})

    def _labelled(self, tenant, matchers):
        for (labels, ts, line), metadata in self.entries.get(tenant, {}).items():
            stream = dict(labels)
            if _selects(matchers, stream):
                yield stream, ts, line, metadata

    def query_range(self, tenant: str | None, params: dict[str, str]) -> dict:
        matchers, groups = parse_read(params["query"])
        start, end = _parse_time(params["start"]), _parse_time(params["end"])
        limit = int(params.get("limit", 100))
        direction = params.get("direction", "backward")  # Loki's default
        if direction not in ("forward", "backward"):
            raise LogQLError(f"bad direction {direction!r}")
        hits = []
        for stream, ts, line, metadata in self._labelled(tenant, matchers):
            if not start <= ts < end:
                continue
            labels = {**stream, **metadata}
            extracted: dict[str, str] = {}
            _flatten(json.loads(line), "", extracted)
            for key, value in extracted.items():
                labels[f"{key}_extracted" if key in labels else key] = value
            if all(any(labels.get(name, "") == value for name, value in group) for group in groups):
                hits.append((ts, tuple(sorted(labels.items())), line))
        hits.sort(reverse=direction == "backward")
        hits = hits[:limit]
        result: dict[tuple, list] = {}
        for ts, labels, line in hits:
            result.setdefault(labels, []).append([str(ts), line])
        streams = [{"stream": dict(labels), "values": values} for labels, values in result.items()]
        stats = {"summary": {"totalEntriesReturned": len(hits)}}
        return {"status": "success", "data": {"resultType": "streams", "result": streams, "stats": stats}}

    def delete(self, tenant: str | None, params: dict[str, str]) -> None:
        matchers, filters = parse_delete(params["query"])
        start = _parse_time(params["start"]) if "start" in params else 0
        end = _parse_time(params["end"]) if "end" in params else time.time_ns()
        store = self.entries.get(tenant, {})
        for stream, ts, line, _ in list(self._labelled(tenant, matchers)):
            if start <= ts <= end and all(
                (text in line) if op == "|=" else re.search(text, line) for op, text in filters
            ):
                del store[(tuple(sorted(stream.items())), ts, line)]


@pytest.fixture
def loki_double():
    """A fresh stand-in Loki for one test."""
    double = LokiDouble()
    yield double
    double.close()


@pytest.mark.parametrize(
    "query",
    [
        '{service="ck"} | json | type="x" | groupby_id=~"a"',  # regex label filter: not emitted
        '{service="ck"} | logfmt',
        'sum(count_over_time({service="ck"}[1h]))',
        '{service="ck"} | json | (type="x" or )',
        '{service="ck" | json',
    ],
)
def test_the_double_refuses_what_ratebeam_never_sends(loki_double, query):
    import requests

    answer = requests.get(f"{loki_double.url}/query_range", params={"query": query, "start": "0", "end": "1", "limit": "1", "direction": "forward"}, timeout=5)
    assert answer.status_code == 400


def test_the_double_refuses_parser_stages_in_deletes(loki_double):
    import requests

    answer = requests.post(f"{loki_double.url}/delete", params={"query": '{service="ck"} | json | type="x"'}, timeout=5)
    assert answer.status_code == 400
