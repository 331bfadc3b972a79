"""Keystone auth to Gnocchi: a second Gnocchi 4.7.1 API process in ``auth_mode = keystone`` on the data
of the basic one (``servers.gnocchi.gnocchi_keystone_server``), with the tests' Keystone 30.0.0.

What is collected through Keystone (the rating user's token, Gnocchi found in the catalog) equals what
is collected through basic auth, row for row; a refused password stops ``ratebeam run`` with one line.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
import requests
from pipeline_support import ratebeam
from servers import gnocchi as servers_gnocchi
from servers import keystone as servers_keystone
from servers.gnocchi import HOSTILE, P1, P2, GnocchiKeystoneServer
from servers.keystone import RATING_PASSWORD, RATING_USER
from test_gnocchi import DEFAULT_METRICS, default, workspace

from ratebeam.connectors.collectors.gnocchi.client import GnocchiConnection
from ratebeam.connectors.collectors.gnocchi.collector import GnocchiCollector
from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.fetchers.gnocchi.fetcher import GnocchiFetcher
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError
from ratebeam.transforms.convert_usage import convert_samples

gnocchi_server = servers_gnocchi.gnocchi_server  # the session fixtures
gnocchi_keystone_server = servers_gnocchi.gnocchi_keystone_server
keystone_server = servers_keystone.keystone_server
pytestmark = pytest.mark.postgres


def password(server: GnocchiKeystoneServer, secret: str = RATING_PASSWORD) -> KeystoneCredentials:
    return KeystoneCredentials(server.keystone.api, username=RATING_USER, password=secret, user_domain_id="default",
                               project_name="service", project_domain_id="default", timeout=10, retries=0)


def through_keystone(server: GnocchiKeystoneServer, url: str | None = None, **connection) -> GnocchiConnection:
    """A connection with the rating user's password; ``url=None``: Gnocchi from the catalog."""
    connection.setdefault("keystone", password(server))
    return GnocchiConnection(url, timeout=30, retries=0, **connection)


def collected(col: GnocchiCollector, server: GnocchiKeystoneServer, hour: int) -> dict[str, pl.DataFrame]:
    """Every default metric's rows of every scope in hour ``hour``, sorted (``metric -> frame``)."""
    begin, end = server.basic.at(hour), server.basic.at(hour + 1)
    out = {}
    for name in sorted(DEFAULT_METRICS):
        m = default(name)
        batches = col.collect_all(begin, end, m)
        frames = [pl.from_arrow(convert_samples(b, [m], col.numeric_context)) for b in batches.values()]
        out[name] = pl.concat(frames).sort(pl.all()) if frames else pl.DataFrame()
    return out


def test_quantities_through_keystone_equal_those_through_basic_auth(gnocchi_keystone_server):
    server = gnocchi_keystone_server
    # the second process really is in keystone mode: basic auth is refused there
    assert requests.post(f"{server.url}/v1/search/resource/generic", json={}, auth=("admin", ""),
                         timeout=10).status_code == 401
    basic = GnocchiCollector(GnocchiConnection(server.basic.url, "admin", timeout=30, retries=0))
    keystone = GnocchiCollector(through_keystone(server))  # no url: the catalog's internal ``metric`` endpoint
    for hour in (0, 2):
        want, got = collected(basic, server, hour), collected(keystone, server, hour)
        assert all(len(f) > 0 for f in want.values()), want  # every metric has data in these hours
        for name in want:
            assert got[name].equals(want[name]), name
    assert keystone.requests == basic.requests > 0


def test_fetcher_with_an_application_credential_lists_the_same_scopes(gnocchi_keystone_server):
    server = gnocchi_keystone_server
    credential = KeystoneCredentials(server.keystone.api, application_credential_id=server.keystone.app_credential_id,
                                     application_credential_secret=server.keystone.app_credential_secret,
                                     timeout=10, retries=0)
    fetcher = GnocchiFetcher(through_keystone(server, server.url, keystone=credential), ("instance", "volume"))
    assert fetcher.scopes() == sorted({P1, P2, HOSTILE})


def test_no_metric_endpoint_on_the_interface_is_fatal(gnocchi_keystone_server):
    fetcher = GnocchiFetcher(through_keystone(gnocchi_keystone_server, interface="admin"))
    with pytest.raises(FatalConnectorError, match="admin endpoint for metric service not found"):
        fetcher.scopes()


def test_wrong_password_stops_the_run_with_one_message(gnocchi_keystone_server, tmp_path):
    server = gnocchi_keystone_server
    path = workspace(tmp_path / "ws", server.url)
    config = json.loads(path.read_text())
    config["fetcher"] = {"backend": "source", "scopes": [P1]}
    config["collector"] = {"backend": "gnocchi", "keystone": {
        "url": server.keystone.api, "username": RATING_USER, "password": "wrong-pass", "user_domain_name": "Default",
        "project_name": "service", "project_domain_name": "Default", "retries": 0}}
    path.write_text(json.dumps(config))
    assert ratebeam("db", "upgrade", "-c", str(path)).returncode == 0
    done = ratebeam("run", "-c", str(path), "--now", server.basic.at(2).isoformat())
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam:")]
    assert len(lines) == 1 and "authentication refused: HTTP 401" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "wrong-pass" not in done.stderr


def _config(tmp_path, collector: dict):
    doc = {"metrics": "metrics.yml", "fetcher": {"backend": "source", "scopes": ["p1"]}, "collector": collector,
           "storage": {"backends": [{"backend": "parquet", "url": "rated/"}]}}
    (tmp_path / "metrics.yml").write_text(json.dumps({"metrics": {"cpu": DEFAULT_METRICS["cpu"]}}))
    (tmp_path / "ratebeam.yaml").write_text(json.dumps(doc))
    return load_config(tmp_path / "ratebeam.yaml")


def test_keystone_section_is_validated_at_the_edge(tmp_path):
    keystone = {"url": "http://k:5000/v3", "application_credential_id": "a", "application_credential_secret": "s"}
    good = _config(tmp_path, {"backend": "gnocchi", "keystone": keystone, "region_name": "RegionOne"})
    connection = good.collector.connection
    assert connection.url is None and connection.interface == "internal" and connection.region_name == "RegionOne"
    assert connection.keystone == KeystoneCredentials("http://k:5000/v3", application_credential_id="a",
                                                      application_credential_secret="s")
    assert "'s'" not in repr(connection)
    cases = [
        ({"backend": "gnocchi"}, "collector.url: url is required without keystone"),
        ({"backend": "gnocchi", "keystone": keystone, "username": "admin"},
         "collector.username: basic auth (username/password) or keystone, not both"),
        ({"backend": "gnocchi", "keystone": {**keystone, "url": "http://k:5000"}}, "collector.keystone.url: must end with /v3"),
        ({"backend": "gnocchi", "keystone": {"url": "http://k:5000/v3", "username": "u"}},
         "collector.keystone: give username and password"),
        ({"backend": "gnocchi", "keystone": keystone, "interface": "internalURL"},
         "collector.interface: expected one of admin, internal, public"),
    ]
    for section, message in cases:
        with pytest.raises(InputError) as info:
            _config(tmp_path, section)
        assert message in str(info.value), str(info.value)
