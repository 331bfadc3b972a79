"""``ratebeam.yaml`` options of the ``delta`` storage backend: ``{backend: delta, url: rated/}``.

A Delta table lives at a local path or an object-store URL that delta-rs writes natively
(``s3://``, ``gs://``, ``az://``/``abfss://``); its credentials are ``storage_options`` (delta-rs
keys such as ``AWS_ENDPOINT_URL``) or the usual environment variables.  ``memory://`` is refused:
delta-rs keeps one in-memory store per open table, so a second reader would see an empty table.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ratebeam.connectors.config_model import ConfigModel, Invalid, Location

#: URL schemes delta-rs writes to (a plain path is local).
WRITABLE_SCHEMES = ("", "file", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure")


class DeltaStorageConfig(ConfigModel):
    """A Delta table at a path or object-store URL, compacted past ``compact_files`` small files."""

    backend: Literal["delta"] = "delta"
    url: Location
    #: Passed to delta-rs (e.g. ``{AWS_ENDPOINT_URL: http://127.0.0.1:9000, AWS_REGION: us-east-1}``).
    storage_options: dict[str, str] = Field(default_factory=dict)
    #: A write that leaves more data files than this compacts the table (0: only ``storage compact``).
    compact_files: int = Field(default=256, ge=0)
    #: Superseded files and crash debris younger than this are kept by vacuum: a reader that opened an
    #: older version (a long report) can still read it, a write in flight is never swept.
    retention_hours: int = Field(default=1, ge=0)

    @field_validator("url")
    @classmethod
    def _writable(cls, url: str) -> str:
        scheme = urlsplit(url).scheme.lower()
        if len(scheme) > 1 and scheme not in WRITABLE_SCHEMES:  # one letter: a Windows drive
            raise Invalid(f"delta storage cannot write to {scheme}:// (use a path, s3://, gs:// or az://)")
        return url
