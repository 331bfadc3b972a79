"""``/healthz/live``, ``/healthz/ready`` and ``/metrics`` of ``rpc``, ``serve`` and ``events serve``,
scraped by the test setup's real Prometheus, and each service's SIGTERM.

For each command: a Prometheus with a scrape job pointed at its ``--metrics-port`` sees ``up == 1``
and a ratebeam series with the value the work done gives (calls handled, periods committed by the
first tick as a bounded run commits them, notifications recorded late); the health endpoints answer
200 with every readiness check ``ok``.  Then SIGTERM: the service exits 0 within the bound the docs
state and leaves nothing half done (serve: no lease, the tick committed — tests/test_serve.py;
events serve: the notifications not finished stay in the inbox and a new start bills them as a
clean run does; rpc: a cast sent while it is down waits in the queue and the next start handles it).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from pipeline_support import NOW, RATEBEAM, ratebeam, setup_database, stored_rows, workspace
from servers import free_port
from servers import prometheus as servers_prometheus
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

#: SIGTERM to exit, at most (docs/deployment.md): serve lease_seconds + the cancel; the others less.
STOP_BOUND = {"rpc": 60, "events": 60}


class Service:
    """A long-running ratebeam command as a subprocess, its log in ``log``, its endpoints on ``port``."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.log_path = log
        with log.open("w") as out:
            self.proc = subprocess.Popen([*RATEBEAM, *args, "--metrics-port", str(self.port), "--metrics-host",
                                          "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=out, text=True)

    def log(self) -> str:
        return self.log_path.read_text()

    def get(self, path: str) -> tuple[int, dict]:
        answer = requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=30)
        return answer.status_code, answer.json()

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except requests.RequestException:
                pass  # not listening yet
            assert self.proc.poll() is None, f"{what}: the service ended ({self.proc.returncode}): {self.log()[-5000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.log()[-5000:]}"
            time.sleep(0.3)

    def ready(self) -> bool:
        status, body = self.get("/healthz/ready")
        return status == 200 and body["ready"] is True

    def terminate(self) -> tuple[int, float]:
        """SIGTERM; (exit status, seconds it took)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=300)
        return code, time.monotonic() - started


def prometheus_value(server, query: str) -> float | None:
    found = servers_prometheus.instant(server, query)
    return next(iter(found.values())) if len(found) == 1 else None


def check_health(service: Service, checks: set[str]) -> None:
    status, body = service.get("/healthz/live")
    assert status == 200 and body["live"] is True, body
    status, body = service.get("/healthz/ready")
    assert status == 200, body
    assert body["checks"] == dict.fromkeys(checks, "ok")


# --- rpc -------------------------------------------------------------------------------------------

def rpc_client(url: str):
    import oslo_messaging
    from oslo_config import cfg

    # oslo.messaging reads some options (tracing) from the global CONF whatever it is given.
    cfg.CONF([], project="ratebeam-test", default_config_files=[], default_config_dirs=[])
    transport = oslo_messaging.get_rpc_transport(cfg.CONF, url=url)
    target = oslo_messaging.Target(exchange="cloudkitty", topic="cloudkitty", version="1.0")
    return transport, oslo_messaging.get_rpc_client(transport, target, timeout=60)


def scope_state(config: Path, scope: str) -> datetime:
    cfg = load_config(config)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, cfg.fetcher.backend, cfg.collector.backend)
    return next(s.last_processed for s in store.list_states() if s.scope == scope)


def test_rpc_serves_health_and_metrics_and_a_cast_sent_while_stopped_waits_for_the_next_start(
        tmp_path, rabbitmq_url):  # noqa: F811
    config = workspace(tmp_path / "ws")
    setup_database(config)
    assert ratebeam("run", "-c", str(config), "--now", NOW, "--quiet").returncode == 0
    rated_to = scope_state(config, "acme-web")
    reset_to = datetime(2026, 1, 1, 2, tzinfo=UTC)
    assert rated_to > reset_to

    args = ["rpc", "-c", str(config), "--transport-url", rabbitmq_url]
    service = Service(args, tmp_path / "rpc.log")
    transport, client = rpc_client(rabbitmq_url)
    try:
        with servers_prometheus.scraping(tmp_path / "prom", {"rpc": f"127.0.0.1:{service.port}"}) as prometheus:
            service.wait_until(service.ready, "rpc to be ready")
            check_health(service, {"database", "rpc"})
            usage = {"instance": [{"desc": {"groupby": {}, "metadata": {"flavor_name": "m1.small"}},
                                   "vol": {"qty": 1, "unit": "instance"}}]}
            for _ in range(2):
                client.prepare(namespace="rating", version="1.1").call({}, "quote", res_data={"usage": usage})
            service.wait_until(lambda: prometheus_value(prometheus, 'up{job="rpc"}') == 1, "up == 1")
            service.wait_until(lambda: prometheus_value(
                prometheus, 'ratebeam_rpc_calls_total{job="rpc",method="quote",outcome="ok"}') == 2,
                "Prometheus to have scraped the two quotes")
            assert prometheus_value(prometheus, 'ratebeam_dead_letters_open{job="rpc",kind="frame"}') == 0
            lag = prometheus_value(prometheus, 'ratebeam_scope_lag_seconds{job="rpc",scope="acme-web"}')
            expected = (datetime.now(UTC) - rated_to - timedelta(hours=1)).total_seconds()
            assert lag == pytest.approx(expected, abs=60)

        code, took = service.terminate()
        assert code == 0 and took < STOP_BOUND["rpc"], service.log()[-3000:]
        assert "ratebeam rpc: stopped" in service.log()
        # Nobody serves the topic now: the cast waits in the broker's queue for the next server.
        client.prepare(version="1.0").cast({}, "reset_state", res_data={
            "scopes": [{"scope_id": "acme-web"}], "last_processed_timestamp": reset_to.isoformat()})
        time.sleep(2)
        assert scope_state(config, "acme-web") == rated_to
        again = Service(args, tmp_path / "rpc-again.log")
        try:
            again.wait_until(lambda: scope_state(config, "acme-web") == reset_to - timedelta(hours=1),
                             "the queued reset to be handled by the next start")
        finally:
            assert again.terminate()[0] == 0
    finally:
        if service.proc.poll() is None:
            service.terminate()
        transport.cleanup()


# --- serve -----------------------------------------------------------------------------------------

def test_serve_serves_health_and_the_first_ticks_figures_to_prometheus(tmp_path, prism_endpoint):
    """Three simulated ticks 6 h apart, 12 s apart on the wall clock: Prometheus scrapes tick 0's
    periods committed (what a bounded run at T0 commits) while tick 0 or tick 1 is the last begun.

    (Tick 0 commits once its work is done.  With the earlier clock, on a starved CPU, Prism once
    closed its window only with tick 1, which then skipped the scopes tick 0 still leased: the
    figure is the same, one tick later.  The third tick keeps the service up meanwhile.)"""
    from test_serve import SETTINGS, STEP, T0, serve_args

    reference = workspace(tmp_path / "bounded", **SETTINGS)
    setup_database(reference)
    first = ratebeam("run", "-c", str(reference), "--now", T0.isoformat(), "--json")
    committed = json.loads(first.stdout)["periods"]["rated"]
    assert committed > 0

    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    service = Service(serve_args(config, prism_endpoint, ticks=3, interval="12", step=STEP), tmp_path / "serve.log")
    with servers_prometheus.scraping(tmp_path / "prom", {"serve": f"127.0.0.1:{service.port}"}) as prometheus:
        service.wait_until(service.ready, "serve to be ready (job running)", timeout=300)
        check_health(service, {"database", "runner"})

        def tick_0_scraped() -> bool:
            pair = (prometheus_value(prometheus, 'ratebeam_periods_committed{job="serve"}'),
                    prometheus_value(prometheus, 'ratebeam_cycles{job="serve"}'))
            return pair[0] == committed and pair[1] in (1, 2)

        service.wait_until(tick_0_scraped, f"Prometheus to scrape tick 0's {committed} periods", timeout=300)
        assert prometheus_value(prometheus, 'up{job="serve"}') == 1
        assert prometheus_value(prometheus, 'ratebeam_dead_letters_open{job="serve",kind="frame"}') == 0
        assert prometheus_value(prometheus, 'ratebeam_database_up{job="serve"}') == 1
        code = service.proc.wait(timeout=300)
    assert code == 0, service.log()[-3000:]


# --- events serve ----------------------------------------------------------------------------------

def test_events_serve_serves_health_metrics_and_stops_on_sigterm_leaving_the_inbox(
        tmp_path, rabbitmq_url, prism_endpoint):  # noqa: F811
    """The worked example of tests/test_events_stream.py in two parts with a SIGTERM between them."""
    from test_events_stream import (
        CLOCK,
        STRAGGLER,
        check_hand_computation,
        events_workspace,
        late,
        lifecycle_done,
        lifecycle_messages,
        read_by_the_job,
        send,
        unfinished,
    )

    config = events_workspace(tmp_path / "ws", rabbitmq_url, "rb-events-ops")
    args = ["-v", "events", "serve", "-c", str(config), "--runner", "PortableRunner",
            f"--option=--job_endpoint={prism_endpoint}", "--option=--environment_type=LOOPBACK"]
    first, rest = lifecycle_messages()[:4], lifecycle_messages()[4:]
    service = Service(args, tmp_path / "events.log")
    try:
        with servers_prometheus.scraping(tmp_path / "prom", {"events": f"127.0.0.1:{service.port}"}) as prometheus:
            service.wait_until(service.ready, "events serve to be ready", timeout=300)
            check_health(service, {"database", "broker", "runner"})
            send(rabbitmq_url, first, times=2)
            service.wait_until(lambda: read_by_the_job(config) == len(first), "the first part to be read")
            service.wait_until(lambda: prometheus_value(prometheus, 'up{job="events"}') == 1, "up == 1")
            service.wait_until(lambda: prometheus_value(prometheus, 'ratebeam_events_inbox_depth{job="events"}')
                               == unfinished(config), "the inbox depth scraped")
        left = unfinished(config)
        assert left > 0  # vm-1's notifications wait for its frames
        code, took = service.terminate()
        assert code == 0 and took < STOP_BOUND["events"], service.log()[-3000:]
        assert unfinished(config) == left  # SIGTERM finished nothing it had not stored

        service = Service(args, tmp_path / "events-again.log")
        with servers_prometheus.scraping(tmp_path / "prom2", {"events": f"127.0.0.1:{service.port}"}) as prometheus:
            service.wait_until(service.ready, "events serve to be ready again", timeout=300)
            send(rabbitmq_url, rest, times=2)
            send(rabbitmq_url, [CLOCK])
            service.wait_until(lambda: lifecycle_done(config), "the worked example to be stored", timeout=300)
            send(rabbitmq_url, [STRAGGLER])
            service.wait_until(lambda: late(config) != [], "the straggler to be recorded late")
            service.wait_until(lambda: prometheus_value(
                prometheus, 'ratebeam_events_late_recorded{job="events"}') == len(late(config)) == 1,
                "the late notification scraped")
            service.wait_until(lambda: prometheus_value(prometheus, 'ratebeam_events_late{job="events"}') == 1,
                               "the job's late counter scraped")
            lag = prometheus_value(prometheus, 'ratebeam_events_watermark_lag_seconds{job="events"}')
            newest = max(m["timestamp"] for _, _, m in [*first, *rest, CLOCK])
            expected = (datetime.now(UTC) - datetime.fromisoformat(newest).replace(tzinfo=UTC)).total_seconds()
            assert lag == pytest.approx(expected, abs=120)
    finally:
        code, _ = service.terminate() if service.proc.poll() is None else (service.proc.returncode, 0)
    assert code == 0, service.log()[-3000:]
    check_hand_computation(stored_rows(config))
