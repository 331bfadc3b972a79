"""The Aetos collector through a real Aetos 3.0.0 (``servers.aetos``) in front of the tests' Prometheus,
with the tests' Keystone: what a project's token sees, and ratebeam's quantities through Aetos equal
to those straight from Prometheus for the same scope."""

from __future__ import annotations

import polars as pl
import pytest
import yaml
from prometheus_support import collector as prometheus_collector
from prometheus_support import metric, period, rows
from servers import aetos as aetos_servers
from servers import keystone as keystone_servers
from servers.aetos import READER, READER_PASSWORD, AetosServer
from servers.keystone import RATING_PASSWORD, RATING_USER
from servers.prometheus import HOSTILE
from test_keystone_fetcher import configured

from ratebeam.connectors.collectors.aetos.collector import AetosClient, AetosCollector
from ratebeam.connectors.collectors.aetos.config import AetosConnection
from ratebeam.connectors.errors import FatalConnectorError, NoDataCollected
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.registry import make_collector
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError
from ratebeam.transforms.convert_usage import convert_samples

keystone_server = keystone_servers.keystone_server  # the session fixtures
aetos_server = aetos_servers.aetos_server

INSTANCE = metric("ratebeam_instance_up", groupby=["id", "flavor_name"], metadata=["os_distro"])
VOLUME = metric("ratebeam_volume_bytes", groupby=["id", "volume_type"], factor="1/1073741824",
                extra_args={"aggregation_method": "sum"})
NET = metric("ratebeam_net_bytes_total", groupby=["interface"],
             extra_args={"aggregation_method": "sum", "range_function": "rate"})
METRICS = (INSTANCE, VOLUME, NET)


def credentials(server: AetosServer, user: str = RATING_USER, password: str = RATING_PASSWORD,
                project: str = "service") -> KeystoneCredentials:
    return KeystoneCredentials(server.keystone.api, username=user, password=password, user_domain_id="default",
                               project_name=project, project_domain_id="default", timeout=10, retries=0)


def aetos(server: AetosServer, url: str | None = "", **who) -> AetosCollector:
    """An Aetos collector; ``url=None`` finds Aetos in Keystone's catalog."""
    connection = AetosConnection(credentials(server, **who), server.api if url == "" else url)
    return AetosCollector(connection, "project_id")


def usage(col, scope: str, hour: int, m) -> pl.DataFrame:
    begin, end = period(hour)
    return rows(convert_samples(col.collect(scope, begin, end, m), [m], col.numeric_context))


def test_a_projects_token_sees_only_its_series(aetos_server):
    """The reader of tenant-a: Aetos rewrites its query to tenant-a's series; the rating user
    (admin on its project, as CloudKitty's) sees every project's."""
    query = "ratebeam_instance_up"
    reader = AetosClient(AetosConnection(credentials(aetos_server, READER, READER_PASSWORD, "tenant-a"),
                                         aetos_server.api))
    seen = {s["metric"]["project_id"] for s in reader.query(query, period(1)[1])}
    assert seen == {aetos_server.tenant_a}
    rating = AetosClient(AetosConnection(credentials(aetos_server), aetos_server.api))
    everything = {s["metric"]["project_id"] for s in rating.query(query, period(1)[1])}
    assert {aetos_server.tenant_a, aetos_server.tenant_b, HOSTILE} <= everything


@pytest.mark.parametrize("m", METRICS, ids=lambda m: m.name)
def test_quantities_through_aetos_equal_prometheus(aetos_server, m):
    direct = prometheus_collector(aetos_server.prometheus.api)
    through = aetos(aetos_server)
    scopes = [aetos_server.tenant_a, aetos_server.tenant_b] + ([HOSTILE] if m is INSTANCE else [])
    for scope in scopes:  # the hostile id (instances only) stays escaped through Aetos
        for hour in (0, 2):
            expected = usage(direct, scope, hour, m)
            assert not expected.is_empty()
            assert usage(through, scope, hour, m).equals(expected), (scope, hour)
    begin, end = period(1)
    batched = through.collect_all(begin, end, m)
    assert set(batched) >= {aetos_server.tenant_a, aetos_server.tenant_b}
    straight = direct.collect_all(begin, end, m)
    assert set(batched) == set(straight)
    assert all(rows(batched[k]).equals(rows(straight[k])) for k in straight)


def test_a_readers_collector_has_only_its_projects_data(aetos_server):
    reader = aetos(aetos_server, user=READER, password=READER_PASSWORD, project="tenant-a")
    direct = prometheus_collector(aetos_server.prometheus.api)
    assert usage(reader, aetos_server.tenant_a, 1, INSTANCE).equals(usage(direct, aetos_server.tenant_a, 1, INSTANCE))
    begin, end = period(1)
    with pytest.raises(NoDataCollected):
        reader.collect(aetos_server.tenant_b, begin, end, INSTANCE)
    assert set(reader.collect_all(begin, end, INSTANCE)) == {aetos_server.tenant_a}


def test_aetos_found_in_the_catalog(aetos_server):
    found = aetos(aetos_server, url=None)
    assert usage(found, aetos_server.tenant_a, 0, VOLUME).equals(
        usage(prometheus_collector(aetos_server.prometheus.api), aetos_server.tenant_a, 0, VOLUME))
    assert found.requests == 1


def test_wrong_password_is_fatal(aetos_server):
    begin, end = period(0)
    with pytest.raises(FatalConnectorError, match="authentication refused: HTTP 401") as info:
        aetos(aetos_server, password="wrong-pass").collect(aetos_server.tenant_a, begin, end, INSTANCE)
    assert "wrong-pass" not in str(info.value)


# ---- a whole cycle: Keystone fetcher + Aetos collector ----


def test_a_run_through_aetos_stores_what_prometheus_gives(aetos_server, tmp_path):
    """Keystone's scopes, collected through Aetos with the default (batched: the metrics have no
    query_prefix/suffix), rated and stored == the same scopes straight from Prometheus per scope (the
    in-process cycle of the Prometheus pipeline tests, their metrics and rules)."""
    from pipeline_support import stored_rows
    from test_prometheus_pipeline import run
    from test_prometheus_pipeline import workspace as prometheus_workspace

    keystone = {"url": aetos_server.keystone.api, "username": RATING_USER, "password": RATING_PASSWORD,
                "user_domain_id": "default", "project_name": "service", "project_domain_id": "default"}
    scopes = sorted(aetos_server.keystone.rated())
    through = prometheus_workspace(tmp_path / "aetos", aetos_server.prometheus.api,
                                   fetcher={"backend": "keystone", **keystone})
    doc = yaml.safe_load(through.read_text())
    doc["collector"] = {"backend": "aetos", "keystone": {**keystone, "timeout": 10}, "url": aetos_server.api}
    through.write_text(yaml.safe_dump(doc))
    straight = prometheus_workspace(tmp_path / "prometheus", aetos_server.prometheus.api, batched=False,
                                    fetcher={"backend": "source", "scopes": scopes})
    reports = {"through": run(through), "straight": run(straight)}
    for report in reports.values():
        assert report.counters["scopes_fetched"] == len(scopes) and not report.failures
    periods, metrics = 5, 3
    assert reports["through"].counters["prometheus_requests"] == periods * metrics  # one per (period, metric)
    assert reports["straight"].counters["prometheus_requests"] == len(scopes) * periods * metrics
    rated = stored_rows(through)
    assert set(rated["scope_id"]) == {aetos_server.tenant_a, aetos_server.tenant_b}  # the others have no usage
    assert rated.equals(stored_rows(straight))


# ---- ratebeam.yaml ----


KEYSTONE = {"url": "http://k:5000/v3", "username": "u", "password": "p", "user_domain_name": "Default",
            "project_name": "service", "project_domain_name": "Default"}


def test_config_section(tmp_path, aetos_server):
    keystone = {**KEYSTONE, "url": aetos_server.keystone.api, "username": RATING_USER, "password": RATING_PASSWORD}
    config = load_config(configured(tmp_path, collector={"backend": "aetos", "keystone": keystone, "region_name": "RegionOne",
                                               "batched": True}))
    assert config.collector.batched is True and config.collector.connection.url is None
    collector = make_collector(config.collector, config.scope_key)
    assert isinstance(collector, AetosCollector)
    assert collector._client.url() == aetos_server.api  # from the catalog


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"keystone": {**KEYSTONE, "password": None}}, "collector.keystone: give username and password"),
        ({"keystone": {**KEYSTONE, "url": "http://k:5000"}}, "collector.keystone.url: must end with /v3"),
        ({"keystone": KEYSTONE, "url": "aetos:8080"}, "collector.url: not an http(s) URL"),
        ({"keystone": KEYSTONE, "interface": "private"}, "collector.interface: expected one of admin, internal, public"),
        ({}, "collector.keystone: "),
    ],
)
def test_config_errors_name_the_key(tmp_path, section, message):
    section = {"backend": "aetos", **section}
    if "keystone" in section:
        section["keystone"] = {k: v for k, v in section["keystone"].items() if v is not None}
    with pytest.raises(InputError) as info:
        load_config(configured(tmp_path, collector=section))
    assert message in str(info.value)
