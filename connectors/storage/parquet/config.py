"""``ratebeam.yaml`` options of the ``parquet`` storage backend: ``{backend: parquet, url: rated/}``."""

from __future__ import annotations

from typing import Literal

from ratebeam.connectors.config_model import ConfigModel, Location


class ParquetStorageConfig(ConfigModel):
    """A dataset at an fsspec URL or path."""

    backend: Literal["parquet"] = "parquet"
    url: Location
