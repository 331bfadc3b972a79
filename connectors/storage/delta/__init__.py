"""The ``delta`` storage backend: rated points as one Delta Lake table (``deltalake``), any object store."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """A ``DeltaStorage`` at ``options.url``."""
    from ratebeam.connectors.storage.delta.backend import DeltaStorage

    return DeltaStorage.from_config(options)
