"""Builds a collector from its validated configuration; heavy client modules are imported lazily."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.errors import FatalConnectorError


def make_collector(config: Any, scope_key: str) -> Collector:
    """``config`` is the typed collector section of ratebeam.yaml (``backend`` + its options)."""
    if config.backend == "file":
        from ratebeam.connectors.collectors.file import FileCollector

        return FileCollector(config.options.url, config.options.format, scope_key)
    if config.backend == "prometheus":
        from ratebeam.connectors.collectors.prometheus import PrometheusCollector

        return PrometheusCollector(config.options.connection, scope_key, config.options.batched)
    raise FatalConnectorError(f"unknown collector backend {config.backend!r}")
