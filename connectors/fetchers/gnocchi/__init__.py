"""The ``gnocchi`` fetcher: scope ids are the values of one attribute of Gnocchi's resources."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.fetchers.base import Fetcher


def build(options: Any) -> Fetcher:
    """A ``GnocchiFetcher`` from the validated fetcher section."""
    from ratebeam.connectors.fetchers.gnocchi.fetcher import GnocchiFetcher

    return GnocchiFetcher(options.connection, options.resource_types, options.scope_attribute)
