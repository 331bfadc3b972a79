"""Storage backends by name: turns a storage config into a ``StorageBackend`` on a worker.

Backends are imported only when asked for, so a pipeline writing Parquet never imports an
Elasticsearch or InfluxDB client.  A config has ``backend`` (the registry name) and the backend's
settings, either nested as ``options`` (``pipelines.config.StorageConfig``) or on the config itself
(any object with ``backend`` and ``url``).  Each backend's ``from_config(settings)`` reads what it
needs (Parquet: ``url`` and, optionally, ``storage_options`` for fsspec).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ratebeam.connectors.errors import FatalConnectorError

if TYPE_CHECKING:
    from ratebeam.connectors.storage.base import StorageBackend

#: name -> "module:Class"; the class has a ``from_config(config)`` classmethod.
_BACKENDS: dict[str, str] = {
    "parquet": "ratebeam.connectors.storage.parquet:ParquetStorage",
    "elasticsearch": "ratebeam.connectors.storage.search:ElasticsearchStorage",
    "opensearch": "ratebeam.connectors.storage.search:OpenSearchStorage",
    "influxdb": "ratebeam.connectors.storage.influxdb:InfluxDBStorage",
}


def backend_names() -> tuple[str, ...]:
    """The names ``make_backend`` accepts, for error messages and the CLI."""
    return tuple(sorted(_BACKENDS))


def make_backend(config: Any) -> StorageBackend:
    """A new, not yet initialised backend for ``config`` (call ``init()``, then ``close()`` at the end).

    Raises ``FatalConnectorError`` for an unknown name or a backend whose client is not installed.
    """
    name = getattr(config, "backend", None)
    if name not in _BACKENDS:
        raise FatalConnectorError(
            f"storage.backend: unknown storage backend {name!r} (known: {', '.join(backend_names())})"
        )
    module_name, class_name = _BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FatalConnectorError(
            f"storage.backend: {name!r} needs a package that is not installed: {exc}"
        ) from exc
    # ratebeam.yaml's StorageConfig nests the backend's own options; bare option objects work too.
    return getattr(module, class_name).from_config(getattr(config, "options", config))
