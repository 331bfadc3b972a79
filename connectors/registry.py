"""One registry for every connector kind: fetchers, collectors and storage backends.

A connector is a package ``connectors/<kind>s/<package>/`` holding the same files: ``__init__.py``
(its ``build`` entry point), ``config.py`` (its typed configuration), the implementation
(``fetcher.py`` / ``collector.py`` / ``backend.py``) and, for a remote system, ``client.py``.  This
table maps each configuration name to its package; the package is imported only when a connector of
that name is built, so a pipeline writing Parquet never imports an HTTP client.  Adding a connector
is one package and one line here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.extras import missing_package

if TYPE_CHECKING:
    from ratebeam.connectors.collectors.base import Collector
    from ratebeam.connectors.fetchers.base import Fetcher
    from ratebeam.connectors.storage.base import StorageBackend

Kind = Literal["fetcher", "collector", "storage"]

#: kind -> configuration name (``backend:`` in ratebeam.yaml) -> package under ``ratebeam.connectors``.
PACKAGES: dict[str, dict[str, str]] = {
    "fetcher": {
        "source": "fetchers.source",
        "prometheus": "fetchers.prometheus",
        "gnocchi": "fetchers.gnocchi",
        "keystone": "fetchers.keystone",
    },
    "collector": {
        "file": "collectors.file",
        "prometheus": "collectors.prometheus",
        "gnocchi": "collectors.gnocchi",
        "aetos": "collectors.aetos",
    },
    "storage": {
        "parquet": "storage.parquet",
        "delta": "storage.delta",
        "influxdb": "storage.influxdb",
        "elasticsearch": "storage.search",
        "opensearch": "storage.search",
        "loki": "storage.loki",
    },
}


def names(kind: Kind) -> tuple[str, ...]:
    """The configuration names of ``kind``, sorted, for error messages and the CLI."""
    return tuple(sorted(PACKAGES[kind]))


def build(kind: Kind, config: Any, **context: Any) -> Any:
    """A new connector of ``kind`` for ``config`` (an object with ``backend`` and its options).

    The options are ``config.options`` when the section nests them, else ``config`` itself.
    ``context`` is passed to the package's ``build`` (collectors get the ``scope_key``).  Raises
    ``FatalConnectorError`` for an unknown name or a connector whose package is not installed.
    """
    name = getattr(config, "backend", None)
    packages = PACKAGES[kind]
    if name not in packages:
        raise FatalConnectorError(f"{kind}.backend: unknown {kind} backend {name!r} (known: {', '.join(names(kind))})")
    try:  # a connector imports its optional packages when it is built (the ``openstack`` extra's keystoneauth1)
        package = importlib.import_module(f"ratebeam.connectors.{packages[name]}")
        return package.build(getattr(config, "options", config), **context)
    except ImportError as exc:
        raise missing_package(f"{kind}.backend {name!r}", exc) from None


def make_fetcher(config: Any) -> Fetcher:
    """The fetcher of the ``fetcher`` section."""
    return build("fetcher", config)


def make_collector(config: Any, scope_key: str) -> Collector:
    """The collector of the ``collector`` section, collecting for ``scope_key``."""
    return build("collector", config, scope_key=scope_key)


def make_backend(config: Any, scope_key: str | None = None) -> StorageBackend:
    """A new, not yet initialised storage backend (call ``init()``, then ``close()`` at the end).

    ``scope_key`` (the configuration's) lets deletes and rewrites select the points CloudKitty
    wrote too (``StorageBackend.scope_key``).
    """
    backend: StorageBackend = build("storage", config)
    backend.scope_key = scope_key
    return backend
