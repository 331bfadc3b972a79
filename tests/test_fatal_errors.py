"""``ratebeam run`` against real servers that refuse us: a wrong password or a bad TLS setup stops
the run with one line and exit status 2 (Prometheus, InfluxDB, OpenSearch), leaves no dead letter
per frame and no lease behind; a storage server that is down fails frames instead; and a frame an
InfluxDB batch cannot hold fails alone while the healthy scope in the same batch is stored."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
import yaml
from pipeline_support import ratebeam, run_cycle, setup_database, workspace
from servers import influxdb as influx_servers
from servers import prometheus as servers_prometheus
from servers import search as search_servers
from servers.prometheus import SECURE_PASSWORD, SECURE_USER, free_port

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore

prometheus_secure_server = servers_prometheus.prometheus_secure_server
_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1
opensearch_url = search_servers.opensearch_url

ADMIN, ADMIN_PASSWORD = "admin", "adminpw"


@pytest.fixture(scope="module")
def influx_with_auth() -> Iterator[str]:
    """A private influxd 1.6 with authentication on and one admin user."""
    try:
        with influx_servers.running("v1", auth=True) as server:
            created = requests.post(f"{server.url}/query", timeout=10,
                                    data={"q": f"CREATE USER {ADMIN} WITH PASSWORD '{ADMIN_PASSWORD}' WITH ALL PRIVILEGES"})
            assert created.status_code == 200, created.text
            yield server.url
    except influx_servers.InfluxUnavailable as exc:
        pytest.skip(str(exc))


def configured(tmp_path: Path, **sections) -> Path:
    config = workspace(tmp_path / "ws")
    doc = yaml.safe_load(config.read_text())
    doc.update(sections)
    config.write_text(yaml.safe_dump(doc))
    setup_database(config)
    return config


def database(config: Path) -> sa.Engine:
    return make_engine(f"sqlite:///{config.parent / 'ratebeam.db'}")


def assert_stopped(config: Path, done, *expected: str, secret: str | None = None) -> None:
    """Exit 2, one ``ratebeam:`` line saying ``expected``, no traceback, no dead letter, no lease."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if secret is not None:
        assert secret not in done.stderr + done.stdout
    engine = database(config)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ratebeam_dead_letters")).scalar() == 0
        leased = conn.execute(sa.text("SELECT count(*) FROM ratebeam_scope_leases"))
        assert leased.scalar() == 0  # the run's leases were given back
    engine.dispose()


# ---- Prometheus: wrong password, unverifiable certificate ----


def test_prometheus_wrong_password_stops_the_run(tmp_path, prometheus_secure_server):
    api = prometheus_secure_server.server.api.replace("https://", f"https://{SECURE_USER}:wrongpass@")
    config = configured(tmp_path, collector={"backend": "prometheus", "url": api,
                                             "cafile": prometheus_secure_server.cafile, "retries": 3})
    done = run_cycle(config)
    assert_stopped(config, done, "ratebeam: prometheus https://127.0.0.1:", "authentication refused: HTTP 401",
                   secret="wrongpass")
    with database(config).connect() as conn:  # leases (their own table) were released; no timestamp-less state row
        assert conn.execute(sa.text("SELECT count(*) FROM cloudkitty_storage_states")).scalar() == 0


def test_prometheus_unverifiable_certificate_stops_the_run(tmp_path, prometheus_secure_server):
    api = prometheus_secure_server.server.api
    config = configured(tmp_path, collector={"backend": "prometheus", "url": api, "username": SECURE_USER,
                                             "password": SECURE_PASSWORD})
    assert_stopped(config, run_cycle(config), "ratebeam: prometheus https://127.0.0.1:", "TLS",
                   secret=SECURE_PASSWORD)


# ---- InfluxDB: wrong password ----


def test_influxdb_wrong_password_stops_the_run(tmp_path, influx_with_auth):
    storage = {"backends": [{"backend": "influxdb", "url": influx_with_auth, "database": "rated",
                             "username": ADMIN, "password": "not-the-password"}]}
    config = configured(tmp_path, storage=storage)
    assert_stopped(config, run_cycle(config), f"ratebeam: influxdb storage {influx_with_auth}/query",
                   "authentication refused", secret="not-the-password")


# ---- OpenSearch: TLS against a plain-HTTP node ----


def test_opensearch_tls_failure_stops_the_run(tmp_path, opensearch_url):
    https = opensearch_url.replace("http://", "https://")
    config = configured(tmp_path, storage={"backends": [{"backend": "opensearch", "url": https}]})
    assert_stopped(config, run_cycle(config), f"ratebeam: opensearch storage {https}", "TLS")


# ---- a storage server that is down fails frames, not the worker ----


def test_a_storage_server_down_at_setup_fails_frames(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    config = configured(tmp_path, storage={"backends": [{"backend": "influxdb", "url": down, "retries": 0}]})
    done = run_cycle(config)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "frame(s) failed" in done.stdout
    engine = database(config)
    with engine.connect() as conn:
        reasons = [r for (r,) in conn.execute(sa.text("SELECT reason FROM ratebeam_dead_letters"))]
        committed = conn.execute(sa.text(
            "SELECT count(*) FROM cloudkitty_storage_states WHERE last_processed_timestamp IS NOT NULL")).scalar()
    engine.dispose()
    assert reasons and all("RetriableConnectorError" in r and down in r for r in reasons)
    assert committed == 0


# ---- per-frame isolation: one unwritable value fails its frame only ----

GOOD, BAD = "good-scope", "bad-scope"
USAGE = (
    "metric,timestamp,value,project_id,id,flavor_name,os_distro,volume_type\n"
    f"openstack_nova_server_status,2026-01-01T00:30:00Z,1,{GOOD},vm-good,m1.small,ubuntu,\n"
    f"openstack_nova_server_status,2026-01-01T00:30:00Z,1,{BAD},vm-bad\\,m1.small,ubuntu,\n"
)


def test_an_unwritable_frame_fails_alone_and_the_healthy_scope_is_committed(tmp_path, influx_v1):
    database_name = f"iso_{tmp_path.name[-20:].replace('-', '_')}"
    storage = {"backends": [{"backend": "influxdb", "url": influx_v1.url, "database": database_name}]}
    config = configured(tmp_path, storage=storage, fetcher={"backend": "source", "scopes": [GOOD, BAD]})
    (config.parent / "usage.csv").write_text(USAGE)
    done = run_cycle(config, env={"RATEBEAM_LOG_LEVEL": "INFO"})  # the INFO line read below
    assert done.returncode == 1, done.stderr[-3000:]
    assert "writing frame by frame" in done.stderr  # both frames were in one refused batch

    engine = database(config)
    with engine.connect() as conn:
        letters = conn.execute(sa.text("SELECT scope, period_begin, stage, reason FROM ratebeam_dead_letters")).all()
    states = {s.scope: s for s in StateStore(engine, "project_id", "source", "file").list_states()}
    engine.dispose()
    ((scope, begin, stage, reason),) = letters
    assert (scope, stage) == (BAD, "write") and str(begin).startswith("2026-01-01 00:00")
    assert "SkippableConnectorError" in reason and "cannot be an InfluxDB tag" in reason and "vm-bad" in reason
    assert states[GOOD].last_processed == datetime(2026, 1, 3, 23, tzinfo=UTC)
    assert BAD not in states  # never committed: no state row (a lease creates none)

    stored = requests.post(f"{influx_v1.url}/query", timeout=10, data={
        "db": database_name, "q": 'SELECT "qty", "id" FROM "dataframes"'}).json()
    (series,) = stored["results"][0]["series"]
    assert [row[2] for row in series["values"]] == ["vm-good"]  # the healthy scope's point, nothing of the bad one


def test_the_cli_prints_one_line_for_a_fatal_error(tmp_path, influx_with_auth):
    """The same stop through ``ratebeam.pipelines.cli.main`` in this process (no subprocess)."""
    from ratebeam.pipelines.cli import main

    storage = {"backends": [{"backend": "influxdb", "url": influx_with_auth, "username": ADMIN, "password": "nope1"}]}
    config = configured(tmp_path, storage=storage)
    assert main(["run", "-c", str(config), "--now", "2026-01-04T02:00:00Z"]) == 2
    assert ratebeam("state", "list", "-c", str(config)).returncode == 0
