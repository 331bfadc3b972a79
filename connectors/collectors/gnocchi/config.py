"""``ratebeam.yaml`` options of the Gnocchi collector (`cloudkitty/collector/gnocchi.py:263-596`).

The connection options are shared with the Gnocchi fetcher.

```yaml
collector: {backend: gnocchi, url: http://127.0.0.1:8041, username: admin, batched: false, timeout: 60,
            cafile: ca.pem, insecure: false, retries: 3, backoff: 0.5}
```
``url`` is Gnocchi's root (CloudKitty's ``gnocchi_endpoint``; ``/v1`` is added).  ``username`` is
CloudKitty's ``gnocchi_user`` for Gnocchi's ``auth_mode = basic``; ``password`` is only for a proxy
that checks one (Gnocchi ignores it).  Without ``username`` no credentials are sent.

Gnocchi's ``auth_mode = keystone`` (CloudKitty's ``gnocchi_auth_type = keystone`` with its
``auth_section``) is a ``keystone`` section — the Keystone fetcher's options (``KeystoneOptions``:
password or application credential, Keystone's TLS) — instead of ``username``:

```yaml
collector:
  backend: gnocchi
  keystone: {url: http://keystone:5000/v3, username: cloudkitty, password: secret, user_domain_name: Default,
             project_name: service, project_domain_name: Default}
  interface: internal        # the catalog's ``metric`` endpoint (CloudKitty's default internalURL) ...
  region_name: RegionOne
  # url: http://gnocchi:8041  # ... or Gnocchi's root, without a catalog lookup
```
The section's own ``cafile``/``insecure``/``timeout``/``retries`` apply to Gnocchi; the ``keystone``
section's to Keystone.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ratebeam.connectors.collectors.gnocchi.client import GnocchiConnection
from ratebeam.connectors.config_model import (
    NOTHING,
    Boolean,
    Invalid,
    NonEmptyStr,
    Text,
    choice,
    dataclass_from,
    integer,
    seconds,
)
from ratebeam.connectors.fetchers.keystone.config import KeystoneOptions
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions


class GnocchiOptions(HttpOptions):
    """How to reach Gnocchi: the HTTP options plus basic or Keystone auth and retries."""

    url_example: ClassVar[str] = "Gnocchi's root, e.g. http://host:8041"

    url: NonEmptyStr | None = Field(None, description="Gnocchi's root URL (`/v1` is added); optional with `keystone`, where the catalog's `metric` endpoint is used.")  # type: ignore[assignment]  # optional with keystone (the catalog's)
    username: NonEmptyStr | None = Field(None, description="Basic auth user (Gnocchi's `auth_mode = basic`, CloudKitty's `gnocchi_user`).")
    password: Text | None = Field(None, description="Basic auth password.")
    keystone: KeystoneOptions | None = Field(None, description="Keystone authentication (Gnocchi's `auth_mode = keystone`) instead of basic auth.")
    interface: choice(("public", "internal", "admin")) = Field("internal", description="The catalog interface of Gnocchi's endpoint, with `keystone` (CloudKitty's `interface`).")  # type: ignore[valid-type]  # built at run time
    region_name: NonEmptyStr | None = Field(None, description="The catalog region of Gnocchi's endpoint, with `keystone` (CloudKitty's `region_name`).")
    retries: integer(0, MAX_RETRIES) = Field(3, description="Attempts after the first for a failed request (connection errors, timeouts, 429, 5xx), with backoff.")  # type: ignore[valid-type]  # built at run time (config_model)
    backoff: seconds(0, 60, open_low=False) = Field(0.5, description="Seconds before the first retry (doubled each time).")  # type: ignore[valid-type]  # built at run time (config_model)

    @model_validator(mode="after")
    def _auth(self) -> GnocchiOptions:
        if self.keystone is not None:
            for key in ("username", "password"):
                if getattr(self, key) is not None:
                    raise Invalid("basic auth (username/password) or keystone, not both", NOTHING, (key,))
        elif self.url is None:
            raise Invalid(f"url is required without keystone ({self.url_example})", NOTHING, ("url",))
        return self

    @property
    def connection(self) -> GnocchiConnection:
        """The runtime connection the HTTP client is built from."""
        connection = dataclass_from(GnocchiConnection, self)  # ``keystone`` is the section here: replaced
        return dataclasses.replace(connection, keystone=None if self.keystone is None else self.keystone.credentials)


class GnocchiCollectorConfig(GnocchiOptions):
    """The ``gnocchi`` collector: where Gnocchi is and whether to batch all scopes per request."""

    backend: Literal["gnocchi"] = Field(description="The Gnocchi collector: CloudKitty's aggregates requests (CloudKitty's `[collector_gnocchi]`).")
    batched: Boolean = Field(False, description="True: one aggregates request per metric and period for every scope, instead of one per scope.")
