"""``ratebeam.yaml`` options of the Gnocchi collector (spec §3.3).

The connection options are shared with the Gnocchi fetcher.

```yaml
collector: {backend: gnocchi, url: http://127.0.0.1:8041, username: admin, batched: false, timeout: 60,
            cafile: ca.pem, insecure: false, retries: 3, backoff: 0.5}
```
``url`` is Gnocchi's root (CloudKitty's ``gnocchi_endpoint``; ``/v1`` is added).  ``username`` is
CloudKitty's ``gnocchi_user`` for Gnocchi's ``auth_mode = basic``; ``password`` is only for a proxy
that checks one (Gnocchi ignores it).  Without ``username`` no credentials are sent.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from ratebeam.connectors.collectors.gnocchi.client import GnocchiConnection
from ratebeam.connectors.config_model import Boolean, NonEmptyStr, Text, dataclass_from, integer, seconds
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions


class GnocchiOptions(HttpOptions):
    """How to reach Gnocchi: the HTTP options plus basic auth and retries."""

    url_example: ClassVar[str] = "Gnocchi's root, e.g. http://host:8041"

    username: NonEmptyStr | None = None
    password: Text | None = None
    retries: integer(0, MAX_RETRIES) = 3  # type: ignore[valid-type]  # built at run time (config_model)
    backoff: seconds(0, 60, open_low=False) = 0.5  # type: ignore[valid-type]  # built at run time (config_model)

    @property
    def connection(self) -> GnocchiConnection:
        """The runtime connection the HTTP client is built from."""
        return dataclass_from(GnocchiConnection, self)


class GnocchiCollectorConfig(GnocchiOptions):
    """The ``gnocchi`` collector: where Gnocchi is and whether to batch all scopes per request."""

    backend: Literal["gnocchi"]
    batched: Boolean = False
