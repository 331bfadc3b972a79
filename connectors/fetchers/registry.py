"""Builds a fetcher from its validated configuration; heavy client modules are imported lazily."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.fetchers.base import Fetcher


def make_fetcher(config: Any) -> Fetcher:
    """``config`` is the typed fetcher section of ratebeam.yaml (``backend`` + its options)."""
    if config.backend == "source":
        from ratebeam.connectors.fetchers.source import SourceFetcher

        return SourceFetcher(config.options.scopes)
    if config.backend == "prometheus":
        from ratebeam.connectors.fetchers.prometheus import PrometheusFetcher

        options = config.options
        return PrometheusFetcher(options.connection, options.metric, options.scope_attribute, options.filters)
    raise FatalConnectorError(f"unknown fetcher backend {config.backend!r}")
