"""``ratebeam.yaml`` options of the Aetos collector (CloudKitty's ``[collector_aetos]``).

```yaml
collector:
  backend: aetos
  keystone: {url: http://keystone:5000/v3, username: cloudkitty, password: secret,   # the Keystone
             user_domain_name: Default, project_name: service,                       # fetcher's options
             project_domain_name: Default, cafile: ca.pem, timeout: 60, retries: 3}
  interface: public          # the catalog's metric-storage endpoint, as CloudKitty finds Aetos ...
  region_name: RegionOne
  # url: https://aetos:8080/api/v1   # ... or Aetos' URL with the API prefix, without a catalog lookup
  # batched: false  # absent: batched where exact, as the Prometheus collector (prometheus/config.py)
```
The ``keystone`` section's TLS, timeout and retries apply to Aetos too: CloudKitty uses one
keystoneauth session for both.  ``metrics.yml`` takes the Prometheus collector's ``extra_args``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ratebeam.connectors.collectors.prometheus.config import BatchedOption
from ratebeam.connectors.config_model import Invalid, NonEmptyStr, choice
from ratebeam.connectors.fetchers.keystone.config import KeystoneOptions
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials

#: The catalog's service type of Aetos (CloudKitty's ``collector/aetos.py``).
SERVICE_TYPE = "metric-storage"


@dataclass(frozen=True)
class AetosConnection:
    """Where Aetos is (``url``, or the catalog's endpoint) and the Keystone credentials to reach it."""

    keystone: KeystoneCredentials
    url: str | None = None
    interface: str = "public"
    region_name: str | None = None


class AetosCollectorConfig(BatchedOption):
    """The ``aetos`` collector: Keystone credentials, where Aetos is, whether to batch all scopes."""

    backend: Literal["aetos"] = Field(description="The Aetos collector: the Prometheus collector's queries through Aetos, with a Keystone token.")
    keystone: KeystoneOptions = Field(description="How to get the Keystone token Aetos checks.")
    url: NonEmptyStr | None = Field(None, description="Aetos' URL with its API prefix; absent: the catalog's `metric-storage` endpoint.")
    interface: choice(("public", "internal", "admin")) = Field("public", description="The catalog interface of Aetos' endpoint.")  # type: ignore[valid-type]  # built at run time
    region_name: NonEmptyStr | None = Field(None, description="The catalog region of Aetos' endpoint.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise Invalid("not an http(s) URL (Aetos' URL with the API prefix, e.g. https://aetos:8080/api/v1)")
        return url

    @property
    def connection(self) -> AetosConnection:
        """The runtime connection the collector is built from."""
        return AetosConnection(self.keystone.credentials, self.url, self.interface, self.region_name)
