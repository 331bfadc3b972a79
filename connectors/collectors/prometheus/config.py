"""``ratebeam.yaml`` options of the Prometheus collector (`cloudkitty/collector/prometheus_base.py:115-174`).

The connection options are shared with the Prometheus fetcher.

```yaml
collector: {backend: prometheus, url: http://127.0.0.1:9090/api/v1, timeout: 60,
            username: u, password: p,   # or bearer_token: t
            cafile: ca.pem, insecure: false, retries: 3, backoff: 0.5}
```
``url`` must include the API prefix, like CloudKitty's ``prometheus_url``.  The metrics' groupby /
metadata names are checked against PromQL's grammar when ``metrics.yml`` is loaded for this
collector.

``batched`` (``BatchedOption``, shared with the Aetos collector) is absent by default: every metric
whose query can be sent once for all scopes (``promql.batchable``) is, the others are collected
per scope, in the same run.  ``false`` collects every metric per scope; ``true`` asks for batching
and refuses (one configuration error naming the metric) a metric that cannot be batched exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ratebeam.connectors.collectors.prometheus.client import PrometheusConnection
from ratebeam.connectors.collectors.prometheus.promql import batchable
from ratebeam.connectors.config_model import (
    NOTHING,
    Boolean,
    ConfigModel,
    Invalid,
    NonEmptyStr,
    Text,
    dataclass_from,
    integer,
    seconds,
)
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions
from ratebeam.transforms.metric_defs import MetricDef


class PrometheusOptions(HttpOptions):
    """How to reach Prometheus: the HTTP options plus basic auth or a bearer token, and retries."""

    url_example: ClassVar[str] = "it must include the API prefix, e.g. http://host:9090/api/v1"

    username: NonEmptyStr | None = Field(None, description="Basic auth user (with `password`).")
    password: Text | None = Field(None, description="Basic auth password (with `username`).")
    bearer_token: NonEmptyStr | None = Field(None, description="A bearer token instead of basic auth.")
    retries: integer(0, MAX_RETRIES) = Field(3, description="Attempts after the first for a failed request (connection errors, timeouts, 429, 5xx), with backoff; `Retry-After` honoured.")  # type: ignore[valid-type]  # built at run time (config_model)
    backoff: seconds(0, 60, open_low=False) = Field(0.5, description="Seconds before the first retry (doubled each time, capped at 30 s).")  # type: ignore[valid-type]  # built at run time (config_model)

    @model_validator(mode="after")
    def _auth(self) -> PrometheusOptions:
        if (self.username is None) != (self.password is None):
            raise Invalid("username and password go together (basic auth)", NOTHING)
        if self.bearer_token is not None and self.username is not None:
            raise Invalid("use either username/password or bearer_token, not both", NOTHING, ("bearer_token",))
        return self

    @property
    def connection(self) -> PrometheusConnection:
        """The runtime connection the HTTP client is built from."""
        return dataclass_from(PrometheusConnection, self)


class BatchedOption(ConfigModel):
    """``batched``: absent (automatic), ``true`` or ``false``; see the module docstring."""

    batched: Boolean | None = Field(None, description="Absent: one query per metric and period for all scopes wherever that gives the same points, per scope otherwise; `false`: every query per scope, as CloudKitty; `true`: all batched (refused if a metric cannot be).")

    def batched_metrics(self, metrics: Sequence[MetricDef]) -> tuple[bool, ...]:
        """For each metric, whether the graph's batched stage sends it once for all scopes."""
        return tuple(self.batched is not False and batchable(m) for m in metrics)

    def check_metrics(self, metrics: Sequence[MetricDef]) -> None:
        """Refuse ``batched: true`` when a metric cannot be batched exactly (``Invalid`` at ``batched``).

        Silently collecting it per scope would hide that the option does not do what it says; the
        operator removes ``batched`` (automatic: that metric per scope, the others batched).
        """
        if self.batched is not True:
            return
        for metric in metrics:
            if not batchable(metric):
                raise Invalid(
                    f"true, but metric {metric.name!r} cannot be batched: its query_prefix/query_suffix may "
                    "aggregate the scope away (remove batched to collect it per scope and the others batched)",
                    NOTHING, ("batched",),
                )


class PrometheusCollectorConfig(PrometheusOptions, BatchedOption):
    """The ``prometheus`` collector: where Prometheus is and whether to batch all scopes per query."""

    backend: Literal["prometheus"] = Field(description="The Prometheus collector: CloudKitty's PromQL queries (CloudKitty's `[collector_prometheus]`).")
