"""``ratebeam.yaml`` options of the Prometheus collector (spec §3.1).

The connection options are shared with the Prometheus fetcher.

```yaml
collector: {backend: prometheus, url: http://127.0.0.1:9090/api/v1, batched: false, timeout: 60,
            username: u, password: p,   # or bearer_token: t
            cafile: ca.pem, insecure: false, retries: 3, backoff: 0.5}
```
``url`` must include the API prefix, like CloudKitty's ``prometheus_url``.  The metrics' groupby /
metadata names are checked against PromQL's grammar when ``metrics.yml`` is loaded for this
collector.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from ratebeam.connectors.collectors.prometheus.client import PrometheusConnection
from ratebeam.connectors.config_model import (
    NOTHING,
    Boolean,
    Invalid,
    NonEmptyStr,
    Text,
    dataclass_from,
    integer,
    seconds,
)
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions


class PrometheusOptions(HttpOptions):
    """How to reach Prometheus: the HTTP options plus basic auth or a bearer token, and retries."""

    url_example: ClassVar[str] = "it must include the API prefix, e.g. http://host:9090/api/v1"

    username: NonEmptyStr | None = None
    password: Text | None = None
    bearer_token: NonEmptyStr | None = None
    retries: integer(0, MAX_RETRIES) = 3  # type: ignore[valid-type]  # built at run time (config_model)
    backoff: seconds(0, 60, open_low=False) = 0.5  # type: ignore[valid-type]  # built at run time (config_model)

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


class PrometheusCollectorConfig(PrometheusOptions):
    """The ``prometheus`` collector: where Prometheus is and whether to batch all scopes per query."""

    backend: Literal["prometheus"]
    batched: Boolean = False
