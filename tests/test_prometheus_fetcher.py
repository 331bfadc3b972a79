"""The Prometheus fetcher against the real test Prometheus, and the Prometheus sections of ratebeam.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import prometheus as servers_prometheus
from servers.prometheus import DOMAINS, HOSTILE, PROJECT_INFO, SCOPES

from ratebeam.connectors.collectors.prometheus.client import PrometheusConnection, PrometheusQueryError
from ratebeam.connectors.fetchers.prometheus.fetcher import PrometheusFetcher
from ratebeam.connectors.registry import make_fetcher
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError

prometheus_server = servers_prometheus.prometheus_server  # the session fixture


def fetcher(api: str, metric: str = PROJECT_INFO, **kwargs) -> PrometheusFetcher:
    return PrometheusFetcher(PrometheusConnection(api, timeout=10, retries=0), metric, **kwargs)


def test_query_is_cloudkittys():
    f = fetcher("http://127.0.0.1:1/api/v1", "openstack_identity_project_info", scope_attribute="tenant_id",
                filters=(("domain_id", "default"), ("enabled", "true")))
    assert f.query == 'max(openstack_identity_project_info{domain_id="default", enabled="true"}) by (tenant_id)'
    assert fetcher("http://x/api/v1").query == "max(ratebeam_project_info) by (project_id)"


def test_distinct_sorted_scopes(prometheus_server):
    assert fetcher(prometheus_server.api).scopes() == sorted(SCOPES)
    assert fetcher(prometheus_server.api, scope_attribute="domain").scopes() == ["default", "other"]


def test_filters_and_hostile_filter_values(prometheus_server):
    default = fetcher(prometheus_server.api, filters=(("domain", "default"),))
    assert default.scopes() == sorted(s for s, d in DOMAINS.items() if d == "default")
    injected = fetcher(prometheus_server.api, filters=(("domain", 'default"} or vector(1) or {x="'),))
    assert injected.scopes() == []
    exact = fetcher(prometheus_server.api, scope_attribute="domain", filters=(("project_id", HOSTILE),))
    assert exact.scopes() == [DOMAINS[HOSTILE]]


def test_a_scope_attribute_no_series_has_gives_no_scope(prometheus_server):
    assert fetcher(prometheus_server.api, scope_attribute="tenant").scopes() == []


def test_unknown_metric_gives_no_scope_and_bad_metric_fails(prometheus_server):
    assert fetcher(prometheus_server.api, "no_such_metric").scopes() == []
    with pytest.raises(PrometheusQueryError):
        fetcher(prometheus_server.api, "rate(").scopes()


# ---- ratebeam.yaml ----

METRICS = """\
metrics:
  ratebeam_instance_up:
    alt_name: instance
    unit: instance
    groupby: [{groupby}]
    metadata: [flavor_name]
"""


def write(tmp_path: Path, collector: str, fetcher_section: str, groupby: str = "id", scope_key: str = "project_id"):
    (tmp_path / "metrics.yml").write_text(METRICS.format(groupby=groupby))
    (tmp_path / "ratebeam.yaml").write_text(
        f"scope_key: {scope_key}\nmetrics: metrics.yml\nfetcher: {fetcher_section}\ncollector: {collector}\n"
        "storage: {backends: [{backend: parquet, url: rated/}]}\n"
    )
    return tmp_path / "ratebeam.yaml"


def test_config_sections(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    config = load_config(write(
        tmp_path,
        "{backend: prometheus, url: 'https://prom:9090/api/v1', batched: true, timeout: 5, username: u, "
        "password: p, cafile: ca.pem, retries: 1, backoff: 0.1}",
        "{backend: prometheus, url: 'http://prom:9090/api/v1', metric: m, scope_attribute: tenant_id, "
        "filters: {domain_id: default}, bearer_token: t, insecure: true}",
    ))
    c = config.collector
    assert c.batched is True
    assert (c.connection.url, c.connection.timeout, c.connection.username, c.connection.password) == (
        "https://prom:9090/api/v1", 5.0, "u", "p")
    assert c.connection.cafile == str(tmp_path / "ca.pem") and c.connection.insecure is False
    assert (c.connection.retries, c.connection.backoff) == (1, 0.1)
    f = config.fetcher
    assert (f.metric, f.scope_attribute, f.filters) == ("m", "tenant_id", (("domain_id", "default"),))
    assert f.connection.bearer_token == "t" and f.connection.insecure is True
    assert "bearer" not in repr(f.connection) and "password" not in repr(c.connection)  # no secrets in logs
    assert make_fetcher(config.fetcher).query == 'max(m{domain_id="default"}) by (tenant_id)'
    assert config.metrics.metrics[0].groupby == ("id", "project_id")


GOOD_COLLECTOR = "{backend: prometheus, url: 'http://prom:9090/api/v1'}"
GOOD_FETCHER = "{backend: source, scopes: [p1]}"


@pytest.mark.parametrize(
    ("collector", "fetcher_section", "groupby", "scope_key", "message"),
    [
        (GOOD_COLLECTOR, GOOD_FETCHER, "id, 'flavor-name'", "project_id",
         "metrics.yml: metrics.ratebeam_instance_up.groupby[1]: not a Prometheus label name "
         "(expected [a-zA-Z_][a-zA-Z0-9_]*): 'flavor-name'"),
        (GOOD_COLLECTOR, GOOD_FETCHER, "id", "'project.id'",
         "metrics.ratebeam_instance_up.groupby: not a Prometheus label name (expected [a-zA-Z_][a-zA-Z0-9_]*) "
         "(the scope_key of ratebeam.yaml, always in groupby): 'project.id'"),
        (GOOD_COLLECTOR, "{backend: prometheus, url: 'http://p/api/v1', metric: m, scope_attribute: 'a b'}",
         "id", "project_id", "ratebeam.yaml: fetcher.scope_attribute: not a Prometheus label name (expected [a-zA-Z_][a-zA-Z0-9_]*): 'a b'"),
        (GOOD_COLLECTOR, "{backend: prometheus, url: 'http://p/api/v1', metric: m, filters: {'x\"': v}}",
         "id", "project_id", "ratebeam.yaml: fetcher.filters: not a Prometheus label name (expected [a-zA-Z_][a-zA-Z0-9_]*): 'x\"'"),
        (GOOD_COLLECTOR, "{backend: prometheus, url: 'http://p/api/v1', metric: 'm{a=\"b\"}'}",
         "id", "project_id", "ratebeam.yaml: fetcher.metric: not a Prometheus metric name"),
        ("{backend: prometheus, url: 'prom:9090'}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector.url: not an http(s) URL"),
        ("{backend: prometheus, url: 'http://p/api/v1', username: u}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector: username and password go together"),
        ("{backend: prometheus, url: 'http://p/api/v1', username: u, password: p, bearer_token: t}", GOOD_FETCHER,
         "id", "project_id", "ratebeam.yaml: collector.bearer_token: use either username/password or bearer_token"),
        ("{backend: prometheus, url: 'http://p/api/v1', timeout: 0}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector.timeout: expected a number of seconds"),
        ("{backend: prometheus, url: 'http://p/api/v1', cafile: nope.pem}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector.cafile: no such file"),
        ("{backend: prometheus, url: 'http://p/api/v1', batched: 1}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector.batched: expected true or false: 1"),
        ("{backend: prometheus, url: 'http://p/api/v1', verify: false}", GOOD_FETCHER, "id", "project_id",
         "ratebeam.yaml: collector.verify: unknown key"),
    ],
)
def test_config_errors_name_the_key(tmp_path, collector, fetcher_section, groupby, scope_key, message):
    with pytest.raises(InputError) as info:
        load_config(write(tmp_path, collector, fetcher_section, groupby, scope_key))
    assert message in str(info.value)


def test_scopes_are_those_present_at_the_cycles_now(prometheus_server):
    from datetime import timedelta

    from servers.prometheus import START

    past = fetcher(prometheus_server.api, "ratebeam_instance_up")
    assert past.scopes() == []  # the backfilled history is long stale at the server's now
    assert past.scopes(START + timedelta(hours=1)) == sorted(SCOPES)  # what `run --now` over it finds
