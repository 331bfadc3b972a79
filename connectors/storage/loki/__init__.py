"""The ``loki`` storage backend: CloudKitty's Loki lines over Loki's HTTP API (`cloudkitty/storage/v2/loki/client.py:212-370`)."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """The backend of a validated ``loki`` section."""
    from ratebeam.connectors.storage.loki.backend import LokiStorage, PushOnlyLokiStorage

    return (PushOnlyLokiStorage if options.push_only else LokiStorage)(options)
