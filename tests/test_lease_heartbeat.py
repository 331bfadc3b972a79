"""A run that lasts several times ``lease_seconds`` keeps its scopes: its heartbeat renews the leases.

Before leases were renewed, a lease was taken once and never renewed, so a run longer than ``lease_seconds``
could be overtaken by the next one.  Here run A collects from the real Prometheus through a local
proxy that holds each answer back, so A lasts well over its 2-second leases; run B, started once
A's leases are older than ``lease_seconds``, must find every scope still held (exit 1, "nothing
was rated") — it would have rated them if A's leases had expired.  A then commits everything.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from pipeline_support import RATEBEAM, counters, ratebeam, setup_database
from servers import prometheus as servers_prometheus
from test_portable_runners import states
from test_prometheus_pipeline import NOW, workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

prometheus_server = servers_prometheus.prometheus_server  # the session fixture

LEASE_SECONDS = 2
DELAY = 0.25  # seconds each collector answer is held back: run A lasts 10 s or more


class _Slow(BaseHTTPRequestHandler):
    """Forwards each GET to ``server.upstream`` and answers after ``DELAY`` seconds."""

    def do_GET(self):
        upstream = requests.get(self.server.upstream + self.path, timeout=30)
        time.sleep(DELAY)
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
        self.end_headers()
        self.wfile.write(upstream.content)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_prometheus(prometheus_server) -> Iterator[str]:
    """The session Prometheus behind a slow proxy: its API URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.upstream = prometheus_server.url
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}{prometheus_server.api_path}"
    server.shutdown()
    server.server_close()


def configured(root, api: str, database_url: str | None = None):
    """The Prometheus workspace collecting from ``api``, with short leases (and another run's database)."""
    config = workspace(root, api, batched=False)  # one request per scope x period x metric: 75 for run A
    doc = json.loads(config.read_text())
    doc["lease_seconds"] = LEASE_SECONDS
    doc["database_url"] = database_url or doc["database_url"]
    config.write_text(json.dumps(doc))
    return config


def leases(config) -> list:
    cfg = load_config(config)
    engine = make_engine(cfg.database_url)
    try:
        return StateStore(engine, cfg.scope_key, "prometheus", "prometheus").leases()
    finally:
        engine.dispose()


def test_a_run_longer_than_its_leases_is_not_overtaken(tmp_path, prometheus_server, slow_prometheus):
    config = configured(tmp_path / "slow", slow_prometheus)
    setup_database(config)
    fast = configured(tmp_path / "fast", prometheus_server.api, load_config(config).database_url)
    a = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW.isoformat()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not leases(config):  # run A has leased its scopes
        assert a.poll() is None and time.monotonic() < deadline, "run A took no lease"
        time.sleep(0.05)
    taken = time.monotonic()
    time.sleep(LEASE_SECONDS * 2)  # A's leases would have expired twice over without a heartbeat
    b = ratebeam("run", "-c", str(fast), "--now", NOW.isoformat())
    assert a.poll() is None, "run A ended before run B: make DELAY longer"
    assert time.monotonic() - taken > LEASE_SECONDS * 2
    assert b.returncode == 1, b.stdout + b.stderr[-3000:]
    assert "nothing was rated: other runs hold the lease of every due scope" in b.stderr
    assert counters(b.stdout)["committed"] == 0

    out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    done = counters(out)
    assert done["due"] == done["committed"] > 0
    assert set(states(config).values()) == {"2026-01-01T04:00:00+00:00"}
