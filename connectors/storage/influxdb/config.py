"""``ratebeam.yaml`` options of the InfluxDB storage backend (`cloudkitty/storage/v2/influx.py:107-356`, `cloudkitty/storage/v2/influx.py:358-744`).

```yaml
storage:
  backends:
    - {backend: influxdb, version: 1, url: http://127.0.0.1:8086, database: cloudkitty,
       retention_policy: autogen, username: u, password: p, timeout: 60, insecure: false}
    - {backend: influxdb, version: 2, url: http://127.0.0.1:8086, token: t, org: openstack,
       bucket: cloudkitty, cafile: ca.pem}
```
``version`` 1 uses ``/write`` + InfluxQL ``/query``; 2 uses ``/api/v2/write``, Flux and
``/api/v2/delete``.  TLS is the shared ``insecure`` / ``cafile`` pair.  ``retries`` (5) and
``batch_lines`` (5000 lines per write request) tune the writer.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from ratebeam.connectors.config_model import (
    NOTHING,
    Invalid,
    NonEmptyStr,
    Text,
    integer,
    says,
)
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions

_V1_ONLY = ("database", "retention_policy")
_V2_ONLY = ("org", "bucket")


class InfluxConnection(HttpOptions):
    """How to reach InfluxDB and which API to speak (``version`` 1: InfluxQL; 2: the v2 API).

    What the backend and its HTTP client are built from: a storage section without its ``backend``
    key (``InfluxDBStorageConfig.connection``), or made directly by tests and benchmarks.
    """

    url_example: ClassVar[str] = "e.g. http://127.0.0.1:8086"

    version: Annotated[Literal[1, 2], says("expected 1 (InfluxQL API) or 2 (v2 API)")] = Field(1, description="The API: 1 (InfluxQL, `/write`) or 2 (Flux, `/api/v2/write`).")
    database: NonEmptyStr = Field("cloudkitty", description="The database (version 1; CloudKitty's `database`).")
    retention_policy: NonEmptyStr = Field("autogen", description="The retention policy written to (version 1).")
    username: NonEmptyStr | None = Field(None, description="User (version 1, with `password`).")
    # Secrets are never shown by repr (logs, failure reasons).
    password: Annotated[Text | None, Field(repr=False)] = Field(None, description="Password (version 1, with `username`); never printed.")
    token: Annotated[NonEmptyStr | None, Field(repr=False)] = Field(None, description="API token (version 2); never printed.")
    org: NonEmptyStr = Field("openstack", description="The organisation (version 2).")
    bucket: NonEmptyStr = Field("cloudkitty", description="The bucket (version 2).")
    retries: integer(0, MAX_RETRIES) = Field(5, description="Attempts after the first for a failed request (connection errors, timeouts, 429, 5xx), with backoff.")  # type: ignore[valid-type]  # built at run time (config_model)
    batch_lines: integer(1) = Field(5000, description="Points per write request.")  # type: ignore[valid-type]  # built at run time (config_model)

    @model_validator(mode="after")
    def _version_options(self) -> InfluxConnection:
        given = self.model_fields_set
        if (self.username is None) != (self.password is None):
            raise Invalid("username and password go together", NOTHING)
        if self.version == 1 and self.token is not None:
            raise Invalid("token is for version 2; version 1 uses username/password", NOTHING, ("token",))
        if self.version == 1 and given.intersection(_V2_ONLY):
            raise Invalid("org and bucket are version 2 options; version 1 uses database/retention_policy", NOTHING)
        if self.version == 2 and given.intersection(_V1_ONLY):
            raise Invalid("database and retention_policy are version 1 options; version 2 uses bucket", NOTHING)
        return self


class InfluxDBStorageConfig(InfluxConnection):
    """The ``influxdb`` storage section: the connection, tagged with its ``backend`` name."""

    backend: Literal["influxdb"] = Field(description="InfluxDB, in CloudKitty's points (CloudKitty's `[storage_influxdb]`, [influxdb.md](influxdb.md)).")

    @property
    def connection(self) -> InfluxConnection:
        """The section's connection, without the ``backend`` tag (already validated: not checked again)."""
        fields = {name: getattr(self, name) for name in InfluxConnection.model_fields}
        return InfluxConnection.model_construct(self.model_fields_set - {"backend"}, **fields)
