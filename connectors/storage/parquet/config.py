"""``ratebeam.yaml`` options of the ``parquet`` storage backend: ``{backend: parquet, url: rated/}``."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ratebeam.connectors.config_model import ConfigModel, Invalid, Location

#: fsspec filesystems that can only read: a dataset cannot be written there.
READ_ONLY_SCHEMES = ("http", "https")


class ParquetStorageConfig(ConfigModel):
    """A dataset at an fsspec URL or path (a writable one: not ``http(s)://``)."""

    backend: Literal["parquet"] = Field("parquet", description="A Parquet file per (scope, period, type) (the embedded store before Delta).")
    url: Location = Field(description="The root directory or object-store prefix of the files.")

    @field_validator("url")
    @classmethod
    def _writable(cls, url: str) -> str:
        if urlsplit(url.split("::")[-1]).scheme.lower() in READ_ONLY_SCHEMES:
            raise Invalid("cannot be written to: fsspec reads http(s) URLs but cannot write there "
                          "(use a path, s3:// or another writable filesystem)")
        return url
