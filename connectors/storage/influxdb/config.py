"""``ratebeam.yaml`` options of the InfluxDB storage backend (spec §7.2, §7.3).

```yaml
storage:
  backends:
    - {backend: influxdb, version: 1, url: http://127.0.0.1:8086, database: cloudkitty,
       retention_policy: autogen, username: u, password: p, timeout: 60, verify: true}
    - {backend: influxdb, version: 2, url: http://127.0.0.1:8086, token: t, org: openstack,
       bucket: cloudkitty, cafile: ca.pem}
```
``version`` 1 uses ``/write`` + InfluxQL ``/query``; 2 uses ``/api/v2/write``, Flux and
``/api/v2/delete``.  ``verify: false`` disables TLS verification; ``cafile`` verifies against a CA
bundle.  ``retries`` (5) and ``batch_lines`` (5000 lines per write request) tune the writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratebeam.connectors.storage.influxdb.client import InfluxConnection
from ratebeam.pipelines.config_http import cafile_option, timeout_option
from ratebeam.pipelines.metrics_config import Where


@dataclass(frozen=True)
class InfluxDBStorageConfig:
    """The ``influxdb`` storage backend: how to reach the server and which API to speak."""

    connection: InfluxConnection


OPTIONAL = (
    "version",
    "database",
    "retention_policy",
    "username",
    "password",
    "token",
    "org",
    "bucket",
    "timeout",
    "verify",
    "cafile",
    "retries",
    "batch_lines",
)


def _build(where: Where, raw: dict[str, Any], base: Path) -> InfluxDBStorageConfig:
    url = where.key("url").string(raw["url"])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise where.key("url").error("not an http(s) URL (e.g. http://127.0.0.1:8086)", url)
    version = raw.get("version", 1)
    if version not in (1, 2) or isinstance(version, bool):
        raise where.key("version").error("expected 1 (InfluxQL API) or 2 (v2 API)", version)

    def text(key: str, default: str | None = None, allow_empty: bool = False) -> str | None:
        return where.key(key).string(raw[key], allow_empty=allow_empty) if key in raw else default

    username, password, token = text("username"), text("password", allow_empty=True), text("token")
    if (username is None) != (password is None):
        raise where.error("username and password go together")
    if version == 1 and token is not None:
        raise where.key("token").error("token is for version 2; version 1 uses username/password")
    if version == 1 and ("org" in raw or "bucket" in raw):
        raise where.error("org and bucket are version 2 options; version 1 uses database/retention_policy")
    if version == 2 and ("database" in raw or "retention_policy" in raw):
        raise where.error("database and retention_policy are version 1 options; version 2 uses bucket")
    verify: bool | str = where.key("verify").boolean(raw.get("verify", True))
    cafile = cafile_option(where, raw, base)
    if cafile is not None:
        if not verify:
            raise where.key("cafile").error("cafile with verify: false makes no sense", cafile)
        verify = cafile
    timeout = timeout_option(where, raw)
    return InfluxDBStorageConfig(
        InfluxConnection(
            url=url,
            version=version,
            database=text("database", "cloudkitty") or "cloudkitty",
            retention_policy=text("retention_policy", "autogen") or "autogen",
            username=username,
            password=password,
            token=token,
            org=text("org", "openstack") or "openstack",
            bucket=text("bucket", "cloudkitty") or "cloudkitty",
            timeout=timeout,
            verify=verify,
            retries=where.key("retries").integer(raw.get("retries", 5), 0),
            batch_lines=where.key("batch_lines").integer(raw.get("batch_lines", 5000), 1),
        )
    )


#: ``BackendSpec(*STORAGE_SPEC)`` in ``pipelines.config.STORAGES``.
STORAGE_SPEC = (("url",), OPTIONAL, _build)
