"""``ratebeam.yaml`` options of the Loki storage backend (CloudKitty's ``[storage_loki]``, `cloudkitty/storage/v2/loki/client.py:212-370`).

```yaml
storage:
  backends:
    - {backend: loki, url: http://127.0.0.1:3100/loki/api/v1, tenant: cloudkitty,
       stream: {service: cloudkitty}, bearer_token: t, cafile: ca.pem, timeout: 60}
```
``url`` is CloudKitty's: the API base (``…/loki/api/v1``) to which ``/push``, ``/query_range`` and
``/delete`` are appended.  ``tenant`` is sent as ``X-Scope-OrgID`` (omit it for a single-tenant Loki);
``username``/``password`` (basic auth, as a gateway or Grafana Cloud wants) or ``bearer_token``.
``batch_lines``/``batch_bytes`` bound one push (Loki refuses bodies above its gRPC message size,
4 MiB by default, and rate-limits bursts); ``page_size`` is the ``limit`` of one ``query_range``
(Loki's ``max_entries_limit_per_query`` is 5000 by default) and ``shard_days`` the longest range one
query covers (Loki refuses ranges above ``max_query_length``, 30 days by default).  A delete with
label filters must first find its points; without a ``begin`` it looks back ``delete_lookback_days``.  CloudKitty's
``buffer_size``/``content_type`` have no use: pushes are batched by the limits above and are always
JSON, gzip-compressed unless ``compression: none``.  ``use_structured_metadata`` needs no option:
the structured metadata CloudKitty 25 indexes is always written, so both of its read modes work.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from annotated_types import Ge, Le
from pydantic import Field, Strict, field_validator, model_validator

from ratebeam.connectors.config_model import NOTHING, Boolean, Invalid, NonEmptyStr, choice, integer, says
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions

#: Loki's (Prometheus') label names.
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Stream labels ratebeam sets itself on every stream.
OWN_LABELS = ("project_id", "scope_id")


def _bounded(low: int, high: int) -> object:
    return Annotated[int, Strict(), Ge(low), Le(high), says(f"expected an integer in [{low}, {high}]")]


class LokiStorageConfig(HttpOptions):
    """One ``loki`` storage section (and the backend's options)."""

    url_example: ClassVar[str] = "e.g. http://127.0.0.1:3100/loki/api/v1"

    backend: Literal["loki"] = Field("loki", description="Loki, in CloudKitty's lines and labels (CloudKitty's `[storage_loki]`, [loki.md](loki.md)).")
    url: NonEmptyStr = Field("http://localhost:3100/loki/api/v1", description="The API base to which `/push`, `/query_range` and `/delete` are appended.")
    tenant: NonEmptyStr | None = Field("cloudkitty", description="Sent as `X-Scope-OrgID`; null for a single-tenant Loki.")
    stream: dict[NonEmptyStr, NonEmptyStr] = Field({"service": "cloudkitty"}, description="The stream labels of every line (ratebeam adds `project_id` and `scope_id`).")
    username: NonEmptyStr | None = Field(None, description="Basic auth user (with `password`), as a gateway wants.")
    password: NonEmptyStr | None = Field(None, description="Basic auth password.")
    bearer_token: NonEmptyStr | None = Field(None, description="A bearer token instead of basic auth.")
    retries: integer(0, MAX_RETRIES) = Field(3, description="Attempts after the first for a failed request (connection errors, timeouts, 429, 5xx), with backoff.")  # type: ignore[valid-type]
    batch_lines: _bounded(1, 100_000) = Field(5000, description="Lines per push at most.")  # type: ignore[valid-type]
    batch_bytes: _bounded(1024, 64 * 1024 * 1024) = Field(1024 * 1024, description="Bytes per push at most (Loki refuses bodies above its gRPC message size).")  # type: ignore[valid-type]
    compression: choice(("gzip", "none")) = Field("gzip", description="The pushes' compression.")  # type: ignore[valid-type]
    page_size: _bounded(1, 100_000) = Field(5000, description="The `limit` of one `query_range` (Loki's `max_entries_limit_per_query`).")  # type: ignore[valid-type]
    shard_days: _bounded(1, 30) = Field(7, description="The longest range one query covers (Loki's `max_query_length`).")  # type: ignore[valid-type]
    delete_lookback_days: _bounded(1, 36_600) = Field(3660, description="How far back a delete without a begin looks for its points.")  # type: ignore[valid-type]
    push_only: Boolean = Field(False, description="True for a server that implements only Loki's push API (VictoriaLogs): a rewrite with other content is added beside the stored line.")

    @field_validator("stream")
    @classmethod
    def _stream_labels(cls, stream: dict[str, str]) -> dict[str, str]:
        if not stream:
            raise Invalid("needs at least one label (Loki refuses a stream without labels)")
        for name in stream:
            if not LABEL_NAME.match(name):
                raise Invalid("not a Loki label name ([A-Za-z_][A-Za-z0-9_]*)", name)
            if name in OWN_LABELS:
                raise Invalid(f"{name!r} is set by ratebeam on every stream", name)
        return stream

    @model_validator(mode="after")
    def _credentials(self) -> LokiStorageConfig:
        if (self.username is None) != (self.password is None):
            missing = "password" if self.password is None else "username"
            raise Invalid("username and password go together", NOTHING, (missing,))
        if self.bearer_token is not None and self.username is not None:
            raise Invalid("bearer_token with username/password: choose one", NOTHING, ("bearer_token",))
        return self
