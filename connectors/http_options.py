"""Options every HTTP connector shares (Prometheus, InfluxDB, Elasticsearch/OpenSearch): one spelling.

``url``, ``timeout`` and TLS as CloudKitty spells it: ``insecure: true`` turns certificate
verification off, ``cafile`` verifies against a private CA bundle (resolved against the config
file's directory; it must exist).  One model, inherited, so a mistake gets the same message
whatever the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ratebeam.connectors.config_model import (
    NOTHING,
    Boolean,
    ConfigModel,
    Invalid,
    NonEmptyStr,
    base_dir,
    seconds,
)
from ratebeam.connectors.http import tls_verify


class HttpOptions(ConfigModel):
    """``url``, ``timeout``, ``insecure`` and ``cafile``; a subclass sets ``url_example``."""

    #: Shown when ``url`` is not an http(s) URL.
    url_example: ClassVar[str] = "e.g. http://127.0.0.1:8080"

    url: NonEmptyStr = Field(description="The server's http(s) URL.")
    timeout: seconds(0, 3600) = Field(60.0, description="Seconds one whole request may take (connect, send, the answer read to its end); a server that trickles bytes is cut off.")  # type: ignore[valid-type]  # built at run time (config_model)
    insecure: Boolean = Field(False, description="True turns TLS certificate verification off (CloudKitty's `insecure`).")
    cafile: NonEmptyStr | None = Field(None, description="A CA bundle to verify the server's certificate with (a private CA); relative to the file; it must exist.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise Invalid(f"not an http(s) URL ({cls.url_example})")
        return url

    @field_validator("cafile")
    @classmethod
    def _existing_file(cls, cafile: str | None, info: ValidationInfo) -> str | None:
        return existing_file(cafile, info)

    @model_validator(mode="after")
    def _tls(self) -> HttpOptions:
        if self.insecure and self.cafile is not None:
            raise Invalid("cafile with insecure: true makes no sense", NOTHING, ("cafile",))
        return self

    @property
    def verify(self) -> bool | str:
        """``requests``' ``verify``: False (insecure), the CA bundle's path, or True."""
        return tls_verify(self.insecure, self.cafile)


def existing_file(name: str | None, info: ValidationInfo) -> str | None:
    """``name`` resolved against the config file's directory; ``Invalid`` if no such file is there."""
    if name is None:
        return None
    path = base_dir(info) / Path(name).expanduser()
    if not path.is_file():
        raise Invalid("no such file", str(path))
    return str(path)
