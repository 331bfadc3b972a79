"""A local HTTP server that answers every request with one canned, hostile reply.

Started by the tests on a free 127.0.0.1 port (``http.server`` in a thread); ``reply`` sets what it
sends next: a status, headers and a body — malformed JSON, HTML, a wrong shape, a redirect to
another host, an error status.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    """What the server sends: status, headers and body."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


class HostileServer:
    """The server; ``url`` is its base, ``reply`` what every request gets, ``paths`` what was asked.

    ``requests`` is every request as (method, path with its query, body): a request sent twice is
    there twice (the retry tests count them).
    """

    def __init__(self) -> None:
        self.reply = Reply()
        self.paths: list[str] = []
        self.requests: list[tuple[str, str, bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                server.paths.append(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                server.requests.append((self.command, self.path, self.rfile.read(length) if length else b""))
                reply = server.reply
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
