"""The ``gnocchi`` collector: CloudKitty's aggregates requests per metric, scope and period (`cloudkitty/collector/gnocchi.py:263-596`).

Its HTTP client (``client.py``) is shared with the Gnocchi fetcher.
"""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.collectors.base import Collector


def build(options: Any, scope_key: str) -> Collector:
    """A ``GnocchiCollector`` from the validated collector section (``batched`` shapes the graph)."""
    from ratebeam.connectors.collectors.gnocchi.collector import GnocchiCollector

    return GnocchiCollector(options.connection, scope_key)
