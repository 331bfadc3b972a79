"""The ``prometheus`` fetcher: scope ids are the values of one label of one Prometheus metric."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.fetchers.base import Fetcher


def build(options: Any) -> Fetcher:
    """A ``PrometheusFetcher`` from the validated fetcher section."""
    from ratebeam.connectors.fetchers.prometheus.fetcher import PrometheusFetcher

    return PrometheusFetcher(options.connection, options.metric, options.scope_attribute, options.filters)
