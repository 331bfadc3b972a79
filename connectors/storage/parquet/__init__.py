"""The ``parquet`` storage backend: a Parquet file per slice through fsspec (``delta`` is the default)."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """A ``ParquetStorage`` at ``options.url``."""
    from ratebeam.connectors.storage.parquet.backend import ParquetStorage

    return ParquetStorage.from_config(options)
