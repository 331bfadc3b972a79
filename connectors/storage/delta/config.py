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

    backend: Literal["delta"] = Field("delta", description="One Delta Lake table: the embedded default ([storage-layout.md](storage-layout.md)).")
    url: Location = Field(description="The table's directory: a path, or `s3://`, `gs://`, `az://`.")
    storage_options: dict[str, str] = Field(description="Passed to delta-rs, e.g. `{AWS_ENDPOINT_URL: http://127.0.0.1:9000, AWS_REGION: us-east-1}`.", default_factory=dict)
    compact_files: int = Field(description="A write that leaves more data files than this compacts the table (0: only `storage compact`).", default=256, ge=0)
    retention_hours: int = Field(description="Superseded files and crash debris younger than this are kept by vacuum: a reader of an older version can still read it, a write in flight is never swept.", default=1, ge=0)

    @field_validator("url")
    @classmethod
    def _writable(cls, url: str) -> str:
        scheme = urlsplit(url).scheme.lower()
        if len(scheme) > 1 and scheme not in WRITABLE_SCHEMES:  # one letter: a Windows drive
            raise Invalid(f"delta storage cannot write to {scheme}:// (use a path, s3://, gs:// or az://)")
        return url
