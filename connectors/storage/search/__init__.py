"""The ``elasticsearch`` and ``opensearch`` storage backends: one implementation, the engine as data (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`)."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """The backend ``options.backend`` names (``elasticsearch`` or ``opensearch``)."""
    from ratebeam.connectors.storage.search.backend import ElasticsearchStorage, OpenSearchStorage

    cls = ElasticsearchStorage if options.backend == "elasticsearch" else OpenSearchStorage
    return cls.from_config(options)
