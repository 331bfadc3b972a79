"""The ``parquet`` storage backend: the embedded default, Parquet files through fsspec."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """A ``ParquetStorage`` at ``options.url``."""
    from ratebeam.connectors.storage.parquet.backend import ParquetStorage

    return ParquetStorage.from_config(options)
