"""``ratebeam.yaml`` options of the Prometheus collector and fetcher (spec §3.1, §3.2).

```yaml
collector: {backend: prometheus, url: http://127.0.0.1:9090/api/v1, batched: false, timeout: 60,
            username: u, password: p,   # or bearer_token: t
            cafile: ca.pem, insecure: false, retries: 3, backoff: 0.5}
fetcher:   {backend: prometheus, url: http://127.0.0.1:9090/api/v1, metric: openstack_identity_project_info,
            scope_attribute: project_id, filters: {domain_id: default}, timeout: 60, ...}
```
``url`` must include the API prefix, like CloudKitty's ``prometheus_url``.  Label names
(``scope_attribute``, filter keys) and the metric name are checked against the PromQL grammar here;
the metrics' groupby / metadata names are checked when ``metrics.yml`` is loaded for this collector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratebeam.connectors.collectors.prometheus.client import PrometheusConnection
from ratebeam.connectors.collectors.prometheus.promql import check_label_name, check_metric_name
from ratebeam.pipelines.config_http import cafile_option
from ratebeam.pipelines.metrics_config import Where

CONNECTION_KEYS = ("username", "password", "bearer_token", "cafile", "insecure", "timeout", "retries", "backoff")


@dataclass(frozen=True)
class PrometheusCollectorConfig:
    """The ``prometheus`` collector: where Prometheus is and whether to batch all scopes per query."""

    connection: PrometheusConnection
    batched: bool = False


@dataclass(frozen=True)
class PrometheusFetcherConfig:
    """The ``prometheus`` fetcher: scope ids = values of ``scope_attribute`` on ``metric``."""

    connection: PrometheusConnection
    metric: str
    scope_attribute: str = "project_id"
    filters: tuple[tuple[str, str], ...] = ()


def _connection(where: Where, raw: dict[str, Any], base: Path) -> PrometheusConnection:
    url = where.key("url").string(raw["url"])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise where.key("url").error("not an http(s) URL (it must include the API prefix, e.g. http://host:9090/api/v1)", url)
    username = where.key("username").string(raw["username"]) if "username" in raw else None
    password = where.key("password").string(raw["password"], allow_empty=True) if "password" in raw else None
    if (username is None) != (password is None):
        raise where.error("username and password go together (basic auth)")
    token = where.key("bearer_token").string(raw["bearer_token"]) if "bearer_token" in raw else None
    if token is not None and username is not None:
        raise where.key("bearer_token").error("use either username/password or bearer_token, not both")
    cafile = cafile_option(where, raw, base)
    return PrometheusConnection(
        url=url,
        username=username,
        password=password,
        bearer_token=token,
        cafile=cafile,
        insecure=where.key("insecure").boolean(raw.get("insecure", False)),
        timeout=_seconds(where.key("timeout"), raw.get("timeout", 60), 0.001, 3600),
        retries=where.key("retries").integer(raw.get("retries", 3), 0),
        backoff=_seconds(where.key("backoff"), raw.get("backoff", 0.5), 0, 60),
    )


def _seconds(where: Where, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise where.error(f"expected a number of seconds in [{low}, {high}]", value)
    return float(value)


def _label(where: Where, value: object) -> str:
    text = where.string(value)
    try:
        return check_label_name(text)
    except ValueError as exc:
        raise where.error(str(exc).split(":")[0], text) from None


def build_collector(where: Where, raw: dict[str, Any], base: Path) -> PrometheusCollectorConfig:
    """The collector section (``backend: prometheus``) as a typed config."""
    return PrometheusCollectorConfig(
        _connection(where, raw, base), where.key("batched").boolean(raw.get("batched", False))
    )


def build_fetcher(where: Where, raw: dict[str, Any], base: Path) -> PrometheusFetcherConfig:
    """The fetcher section (``backend: prometheus``) as a typed config."""
    metric = where.key("metric").string(raw["metric"])
    try:
        check_metric_name(metric)
    except ValueError as exc:
        raise where.key("metric").error(str(exc).split(":")[0], metric) from None
    filters_where = where.key("filters")
    filters_raw = raw.get("filters", {})
    if not isinstance(filters_raw, dict):
        raise filters_where.error("expected a mapping of label names to values", filters_raw)
    filters = tuple(
        (_label(filters_where, k), filters_where.key(k).string(v, allow_empty=True)) for k, v in filters_raw.items()
    )
    return PrometheusFetcherConfig(
        _connection(where, raw, base),
        metric,
        _label(where.key("scope_attribute"), raw.get("scope_attribute", "project_id")),
        filters,
    )


COLLECTOR_REQUIRED = ("url",)
COLLECTOR_OPTIONAL = ("batched", *CONNECTION_KEYS)
FETCHER_REQUIRED = ("url", "metric")
FETCHER_OPTIONAL = ("scope_attribute", "filters", *CONNECTION_KEYS)

#: ``BackendSpec`` arguments (required keys, optional keys, builder) for ``pipelines.config``'s registries.
COLLECTOR_SPEC = (COLLECTOR_REQUIRED, COLLECTOR_OPTIONAL, build_collector)
FETCHER_SPEC = (FETCHER_REQUIRED, FETCHER_OPTIONAL, build_fetcher)
